"""Deliberately broken implementations: each law of ``refcheck.engine.laws`` must be able to fail.

Every mutant is a wrapper around the naive implementation (the reference evaluated in the input
dtype, ``refcheck.model.naive``) with the op's contract signature and one classic kernel bug. ``MUTANTS``
maps its name to its ``Implementation`` record and the laws that must kill it; ``CONTROLS`` are
correct wrappers of the same kind (a precision knob, path knobs) that every law must let live.
A record is reachable as ``tests.mutants:NAME`` (what a law's reproducer prints).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refcheck.model import naive
from refcheck.model.registry import Implementation
from refcheck.references.attention import check_attention_inputs
from refcheck.references.contract import sequence_spans

TF32_DROPPED_BITS = 13


@dataclass(frozen=True)
class Mutant:
    """A broken implementation and the laws that must kill it."""

    impl: Implementation
    kills: tuple[str, ...]
    bug: str


MUTANTS: dict[str, Mutant] = {}
CONTROLS: dict[str, Implementation] = {}


def _record(op: str, fn, knobs, head_first: bool = False, declines: tuple[str, ...] = ()) -> Implementation:
    """The record of ``fn``: named ``tests.mutants:NAME`` (the module attribute holding the record,
    which a law's reproducer resolves), calling the function kept as ``_NAME_fn``."""
    globals()[f"_{fn.__name__}_fn"] = fn
    return Implementation(op, f"{__name__}:{fn.__name__}", f"{__name__}:_{fn.__name__}_fn",
                          knobs=dict(knobs or {}), head_first=head_first, declines=declines,
                          description=(fn.__doc__ or "").strip())


PLAIN_ATTENTION = ("window", "softcap", "sinks")
"""The extensions ``_attention`` (and the mutants built on it, whose ``**options`` would take them) leaves out."""


def mutant(op: str, *kills: str, knobs=None, head_first: bool = False, declines: tuple[str, ...] = ()):
    """Decorator: ``fn`` is a mutant of ``op`` that the laws ``kills`` must catch; the module
    attribute becomes its record."""
    def register(fn) -> Implementation:
        impl = _record(op, fn, knobs, head_first, declines)
        MUTANTS[fn.__name__] = Mutant(impl, kills, impl.description)
        return impl
    return register


def control(op: str, knobs=None, head_first: bool = False):
    """Decorator: ``fn`` is a correct implementation of ``op`` that no law may fail."""
    def register(fn) -> Implementation:
        CONTROLS[fn.__name__] = impl = _record(op, fn, knobs, head_first)
        return impl
    return register


# --- helpers -------------------------------------------------------------------------------------

def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """``x`` moved ``by`` positions along T (dim 1), the edge value repeated: by=-1 reads the next token."""
    if x.shape[1] == 0 or by == 0:
        return x
    if by < 0:
        return torch.cat([x[:, -by:], x[:, -1:].expand(-1, -by, *x.shape[2:])], 1)
    return torch.cat([x[:, :1].expand(-1, by, *x.shape[2:]), x[:, :-by]], 1)


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 values truncated to tf32 (10 mantissa bits), as a tensor core reads them."""
    if x.dtype != torch.float32:
        return x
    bits = x.detach().view(torch.int32) & ~((1 << TF32_DROPPED_BITS) - 1)
    return x + (bits.view(torch.float32) - x).detach()   # truncated values, straight-through gradient


def _attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, offset=0,
               top_left=False, bias=0.0, sink=0.0, fill=-math.inf, keys=None):
    """Softmax attention in float32 with knobs for bugs: the causal diagonal moved by ``offset`` or
    aligned ``top_left``, a score ``bias * j`` growing with the key position, ``sink`` added to key
    0's score, masked scores set to ``fill``; ``keys(pairs)`` may rewrite each sequence's key span."""
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if keys is not None:
        pairs = keys(pairs)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = q.shape[2] // k.shape[2]
    o = q.new_zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), -math.inf, device=q.device)
    for row, (qs, qe), (ks, ke) in pairs:
        if qe == qs or ke == ks:
            continue
        qi = q[row, qs:qe].float().transpose(0, 1)
        kj = k[row, ks:ke].float().repeat_interleave(groups, 1).transpose(0, 1)
        vj = v[row, ks:ke].float().repeat_interleave(groups, 1).transpose(0, 1)
        s = scale * qi @ kj.transpose(1, 2)
        j = torch.arange(ke - ks, device=q.device)
        s = s + bias * j + sink * (j == 0)
        if causal:
            i = torch.arange(qe - qs, device=q.device).unsqueeze(1)
            diagonal = 0 if top_left else (ke - ks) - (qe - qs)
            s = s.masked_fill(j > i + diagonal + offset, fill)
        m = s.amax(-1, keepdim=True)
        seen = torch.isfinite(m)
        e = torch.exp(s - torch.where(seen, m, 0.0))
        z = torch.where(seen, e.sum(-1, keepdim=True), 1.0)
        o[row, qs:qe] = ((e / z) @ vj).transpose(0, 1)
        lse[row, :, qs:qe] = torch.where(seen, m + torch.log(z), -math.inf).squeeze(-1)
    return o.to(q.dtype), lse


# --- law 1: agreement ----------------------------------------------------------------------------

@mutant("attention", "agreement", "grouped_heads", declines=PLAIN_ATTENTION)
def attention_key_heads_tiled(q, k, v, **options):
    """GQA: query head h reads key/value head h % Hk (the shared heads tiled) instead of h // (H // Hk)."""
    groups = q.shape[2] // k.shape[2]
    return _attention(q, k.repeat(1, 1, groups, 1), v.repeat(1, 1, groups, 1), **options)


@mutant("kda", "agreement")
def kda_scale_ignored(q, k, v, g, beta, *, scale=None, **options):
    """The readout scale argument is ignored (always K ** -0.5)."""
    return naive.kda(q, k, v, g, beta, **options)


@mutant("gated_delta_rule", "agreement", "grouped_heads")
def gdr_value_heads_interleaved(q, k, v, g, beta, **options):
    """Grouped value heads: value head j reads query/key head j % H (interleaved) instead of j // (HV // H)."""
    h, hv = q.shape[2], v.shape[2]
    if hv != h:
        heads = torch.arange(hv, device=q.device) % h
        q, k = q[:, :, heads], k[:, :, heads]
    return naive.gated_delta_rule(q, k, v, g, beta, **options)


def _gla_dropping_partial_chunk(q, k, v, g, **options):
    """naive gla with the tokens after the last full chunk of 16 dropped: no output, no state update."""
    full = q.shape[1] // 16 * 16
    keep = (torch.arange(q.shape[1], device=q.device) < full).view(1, -1, 1, 1)
    o, state = naive.gla(q, k * keep, v, g * keep, **options)
    return o * keep, state


@mutant("gla", "agreement")
def gla_dropped_partial_chunk(q, k, v, g, **options):
    """Tokens after the last full chunk of 16 are dropped: no output, no state update."""
    return _gla_dropping_partial_chunk(q, k, v, g, **options)


@mutant("attention", "agreement", declines=PLAIN_ATTENTION)
def attention_top_left_causal(q, k, v, **options):
    """The causal mask is aligned top-left (row i sees keys j <= i) instead of bottom-right."""
    return _attention(q, k, v, top_left=True, **options)


# --- law 2 (and 11): causality -------------------------------------------------------------------

@mutant("kda", "causality")
def kda_future_gate(q, k, v, g, beta, **options):
    """Off-by-one decay: step t decays with the gate of token t + 1."""
    return naive.kda(q, k, v, _shift(g, -1), beta, **options)


@mutant("gla", "causality")
def gla_off_by_one_mask(q, k, v, g, *, scale=None, **options):
    """The intra-chunk mask keeps j <= i + 1: o_t also reads k_{t+1} v_{t+1}."""
    o, state = naive.gla(q, k, v, g, scale=scale, **options)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    nxt = s * (q * _shift(k, -1)).sum(-1, keepdim=True) * _shift(v, -1)
    nxt[:, -1:] = 0
    return o + nxt.to(o.dtype), state


@mutant("attention", "causality", declines=PLAIN_ATTENTION)
def attention_off_by_one_causal(q, k, v, **options):
    """The causal mask lets row i see one key too many (j <= i + S - T + 1)."""
    return _attention(q, k, v, offset=1, **options)


# --- law 3: varlen == separate, batch invariance -------------------------------------------------

@mutant("kda", "varlen_equals_separate")
def kda_state_leaks_across_sequences(q, k, v, g, beta, *, cu_seqlens=None, initial_state=None,
                                     output_final_state=False, **options):
    """Packed sequences: the final state of sequence n leaks into sequence n + 1."""
    if cu_seqlens is None:
        return naive.kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                         **options)
    outs, finals, carry = [], [], None
    for n, (_, s, e) in enumerate(sequence_spans(cu_seqlens, q.shape[0], q.shape[1])):
        h0 = None if initial_state is None else initial_state[n:n + 1]
        if carry is not None:
            h0 = carry if h0 is None else h0 + carry
        if e > s:
            o, carry = naive.kda(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], initial_state=h0,
                                 output_final_state=True, **options)
            outs.append(o)
        else:
            carry = h0 if h0 is not None else carry
        finals.append(carry if carry is not None else q.new_zeros(1, q.shape[2], q.shape[3], v.shape[3]).float())
    o = torch.cat(outs, 1) if outs else q.new_zeros(1, 0, q.shape[2], v.shape[3])
    return o, (torch.cat(finals) if output_final_state else None)


@mutant("attention", "varlen_equals_separate", declines=PLAIN_ATTENTION)
def attention_packed_keys_shared(q, k, v, **options):
    """Packed attention: each query sequence also attends to the keys of earlier sequences."""
    def from_start(pairs):
        return [(row, qspan, (0, ke)) for row, qspan, (_, ke) in pairs]
    return _attention(q, k, v, keys=from_start, **options)


@mutant("gla", "batch_invariance")
def gla_batch_gate_stride(q, k, v, g, **options):
    """A zero batch stride for the gates: every row decays with row 0's gates."""
    return naive.gla(q, k, v, g[:1].expand_as(g), **options)


@mutant("attention", "batch_invariance")
def attention_batch_keys_of_row0(q, k, v, **options):
    """A zero batch stride for the keys: every row attends to row 0's keys."""
    return naive.attention(q, k[:1].expand_as(k), v, **options)


# --- law 4: state chaining -----------------------------------------------------------------------

@mutant("kda", "state_chaining")
def kda_ignores_initial_state(q, k, v, g, beta, *, initial_state=None, **options):
    """The initial state is accepted and ignored (every sequence starts from zero)."""
    return naive.kda(q, k, v, g, beta, **options)


@mutant("gla", "state_chaining")
def gla_final_state_misses_last_token(q, k, v, g, *, cu_seqlens=None, **options):
    """The returned final state is the one before the last token of each sequence was written."""
    o, _ = naive.gla(q, k, v, g, cu_seqlens=cu_seqlens, **options)
    last = torch.zeros(q.shape[:2], dtype=torch.bool, device=q.device)
    for b, s, e in sequence_spans(cu_seqlens, q.shape[0], q.shape[1]):
        if e > s:
            last[b, e - 1] = True
    keep = (~last).view(*last.shape, 1, 1)
    _, state = naive.gla(q, k * keep, v, g * keep, cu_seqlens=cu_seqlens, **options)
    return o, state


@mutant("simple_gla", "state_chaining")
def simple_gla_state_in_bf16(q, k, v, g, **options):
    """The final state is kept in bf16 precision (returned as float32)."""
    o, state = naive.simple_gla(q, k, v, g, **options)
    return o, None if state is None else state.to(torch.bfloat16).float()


# --- laws 16, 17: attention's window, softcap and sinks ------------------------------------------

@mutant("attention", "agreement", "window_locality")
def attention_window_one_too_wide(q, k, v, *, window_size=None, **options):
    """The sliding window's left side reaches one key too far (left + 1)."""
    if window_size is not None and window_size[0] is not None:
        window_size = (window_size[0] + 1, window_size[1])
    return naive.attention(q, k, v, window_size=window_size, **options)


@mutant("attention", "window_locality")
def attention_window_drops_causal(q, k, v, *, window_size=None, causal=False, **options):
    """Given a window, the causal mask is dropped: a window open on the right lets a causal row see later keys."""
    return naive.attention(q, k, v, window_size=window_size, causal=causal and window_size is None, **options)


@mutant("attention", "sinks_neutral")
def attention_sinks_nan_to_num(q, k, v, *, sinks=None, **options):
    """Non-finite sink values replaced by 0 (as for NaN): a sink of -inf becomes a sink of 0."""
    if sinks is not None:
        sinks = torch.where(torch.isfinite(sinks), sinks, torch.zeros_like(sinks))
    return naive.attention(q, k, v, sinks=sinks, **options)


@mutant("attention", "agreement")
def attention_sinks_left_out(q, k, v, *, sinks=None, **options):
    """The sinks are accepted and left out of the softmax denominator."""
    return naive.attention(q, k, v, **options)


@mutant("attention", "agreement")
def attention_sink_with_a_value(q, k, v, *, sinks=None, **options):
    """The sink is a key of value 1 instead of 0: o gains exp(sink - lse) on every channel."""
    o, lse = naive.attention(q, k, v, sinks=sinks, **options)
    if sinks is None:
        return o, lse
    weight = torch.exp(sinks.float().view(1, -1, 1) - lse).transpose(1, 2).unsqueeze(-1)     # [B, T, H, 1]
    return (o.float() + weight).to(o.dtype), lse


@mutant("attention", "agreement")
def attention_softcap_before_scale(q, k, v, *, softcap=None, scale=None, **options):
    """The softcap applied to q.k before the scale: scale * c tanh(q.k / c), i.e. a softcap of scale * c."""
    given = q.shape[-1] ** -0.5 if scale is None else scale
    return naive.attention(q, k, v, scale=scale, softcap=None if softcap is None else softcap * given, **options)


@mutant("attention", "sinks_neutral")
def attention_sinks_nan_without_keys(q, k, v, *, sinks=None, **options):
    """A sink's weight formed as exp(sink - max(sink, m)) unguarded: NaN on rows that see no key when the
    sink is -inf (o and lse NaN there)."""
    o, lse = naive.attention(q, k, v, sinks=sinks, **options)
    if sinks is None:
        return o, lse
    bad = torch.isneginf(lse)
    return torch.where(bad.transpose(1, 2).unsqueeze(-1), torch.nan, o.float()).to(o.dtype), torch.where(bad, torch.nan, lse)


# --- law 15: decode equals prefill ---------------------------------------------------------------

@mutant("gated_delta_rule", "decode_equals_prefill")
def gdr_decode_path_drops_state(q, k, v, g, beta, *, initial_state=None, **options):
    """A decode fast path (one token) that starts from a zero state instead of the state it is given."""
    return naive.gated_delta_rule(q, k, v, g, beta, initial_state=None if q.shape[1] == 1 else initial_state,
                                  **options)


@mutant("kda", "decode_equals_prefill")
def kda_decode_path_undecayed(q, k, v, g, beta, **options):
    """A decode fast path (one token) that skips the token's decay of the carried state (g taken as 0)."""
    return naive.kda(q, k, v, torch.zeros_like(g) if q.shape[1] == 1 else g, beta, **options)


# --- law 19: state pool --------------------------------------------------------------------------

@mutant("kda", "state_pool")
def kda_pool_ignores_indices(q, k, v, g, beta, *, initial_state=None, ssm_state_indices=None,
                             inplace_final_state=False, **options):
    """Reads the pool's first N slots, not those ssm_state_indices names (writes the named ones)."""
    if ssm_state_indices is None:
        return naive.kda(q, k, v, g, beta, initial_state=initial_state, **options)
    first = torch.arange(len(ssm_state_indices), device=ssm_state_indices.device)
    o, final = naive.kda(q, k, v, g, beta, initial_state=initial_state, ssm_state_indices=first,
                         **{**options, "output_final_state": True})
    if inplace_final_state:
        initial_state[ssm_state_indices] = final
        return o, None
    return o, final


@mutant("gated_delta_rule", "state_pool")
def gdr_pool_writes_next_slot(q, k, v, g, beta, *, initial_state=None, ssm_state_indices=None,
                              inplace_final_state=False, **options):
    """Writes each final state into the slot after the one it was read from (an off-by-one stride)."""
    if not inplace_final_state:
        return naive.gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                      ssm_state_indices=ssm_state_indices, **options)
    o, final = naive.gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                      ssm_state_indices=ssm_state_indices, **{**options, "output_final_state": True})
    initial_state[(ssm_state_indices + 1) % initial_state.shape[0]] = final
    return o, None


@mutant("kda", "state_pool")
def kda_pool_zeroes_the_pool(q, k, v, g, beta, *, initial_state=None, ssm_state_indices=None,
                             inplace_final_state=False, **options):
    """Clears the whole pool before writing the named slots back (a memset of the state buffer)."""
    o, final = naive.kda(q, k, v, g, beta, initial_state=initial_state, ssm_state_indices=ssm_state_indices,
                         **{**options, "output_final_state": True} if inplace_final_state else options)
    if not inplace_final_state:
        return o, final
    initial_state.zero_()
    initial_state[ssm_state_indices] = final
    return o, None


@mutant("kda", "state_pool")
def kda_pool_final_state_not_written(q, k, v, g, beta, *, initial_state=None, ssm_state_indices=None,
                                     inplace_final_state=False, **options):
    """Returns the final states instead of writing them into the pool (the keyword taken, not honoured)."""
    return naive.kda(q, k, v, g, beta, initial_state=initial_state, ssm_state_indices=ssm_state_indices,
                     **{**options, "output_final_state": True} if inplace_final_state else options)


# --- laws 20 and 21: a paged cache -------------------------------------------------------------------

def _gathered_rows(k_cache, block_table, width: int):
    """Every row the block table names, occupied or not: ``[N, width * page, ...]``."""
    return k_cache[block_table[:, :width].long()].flatten(1, 2)


@mutant("paged_attention", "pages_shuffled")
def paged_masks_by_multiplying(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """Attends over every row the block table names and masks the rows past each sequence's tokens by
    multiplying their weights by 0 after the softmax (renormalized): exact while those rows hold numbers,
    NaN once one holds NaN (0 * NaN)."""
    n, tq, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    width = block_table.shape[1]
    k, v = _gathered_rows(k_cache, block_table, width), _gathered_rows(v_cache, block_table, width)
    groups = h // k.shape[2]
    k, v = k.repeat_interleave(groups, 2).float(), v.repeat_interleave(groups, 2).float()
    s = torch.einsum("nthd,nshd->nhts", q.float(), k) * scale
    rows = torch.arange(k.shape[1], device=q.device)
    last = seqused_k.view(n, 1, 1, 1) - tq + torch.arange(tq, device=q.device).view(1, 1, tq, 1)
    keep = (rows.view(1, 1, 1, -1) <= last).float()
    w = torch.softmax(s.masked_fill(keep == 0, -1e30), -1) * keep
    o = torch.einsum("nhts,nshd->nthd", w, v)
    lse = torch.logsumexp(s.masked_fill(keep == 0, float("-inf")), -1)
    return o.to(q.dtype), lse


@mutant("paged_attention", "queries_one_at_a_time", "agreement")
def paged_drafts_see_each_other(q, k_cache, v_cache, block_table, seqused_k, **options):
    """Speculative decoding without the causal mask among the draft tokens: every query sees the whole cache."""
    tq = q.shape[1]
    rows = [naive.paged_attention(q[:, i:i + 1], k_cache, v_cache, block_table, seqused_k, **options)
            for i in range(tq)]
    return torch.cat([o for o, _ in rows], 1), torch.cat([lse for _, lse in rows], 2)


@mutant("paged_attention", "pages_shuffled", "agreement")
def paged_pages_assumed_consecutive(q, k_cache, v_cache, block_table, seqused_k, **options):
    """Reads a sequence's pages as consecutive in the pool from its first one (block_table[n, 0] + j), not through
    the block table."""
    first = block_table[:, :1].long()
    table = (first + torch.arange(block_table.shape[1], device=q.device)) % k_cache.shape[0]
    return naive.paged_attention(q, k_cache, v_cache, table.to(block_table.dtype), seqused_k, **options)


@mutant("paged_attention", "queries_one_at_a_time", "agreement")
def paged_queries_aligned_top_left(q, k_cache, v_cache, block_table, seqused_k, **options):
    """The speculative path (Tq > 1) aligns its causal mask top-left: query i sees keys 0 .. i, not
    0 .. L - Tq + i."""
    tq = q.shape[1]
    if tq == 1:
        return naive.paged_attention(q, k_cache, v_cache, block_table, seqused_k, **options)
    rows = [naive.paged_attention(q[:, i:i + 1], k_cache, v_cache, block_table, torch.full_like(seqused_k, i + 1),
                                  **options) for i in range(tq)]
    return torch.cat([o for o, _ in rows], 1), torch.cat([lse for _, lse in rows], 2)


@mutant("paged_attention", "grouped_heads", "agreement")
def paged_heads_interleaved(q, k_cache, v_cache, block_table, seqused_k, **options):
    """Query head j reads key head j % Hk, not j // (H / Hk)."""
    h, hk = q.shape[2], k_cache.shape[2]
    order = torch.arange(h, device=q.device).view(h // hk, hk).t().reshape(-1)     # heads regrouped
    o, lse = naive.paged_attention(q[:, :, order], k_cache, v_cache, block_table, seqused_k, **options)
    back = torch.argsort(order)
    return o[:, :, back], lse[:, back]


# --- law 5: determinism --------------------------------------------------------------------------

@mutant("kda", "determinism")
def kda_noisy_output(q, k, v, g, beta, **options):
    """Unordered accumulation: the output's last bits change from run to run."""
    o, state = naive.kda(q, k, v, g, beta, **options)
    eps = torch.finfo(o.dtype).eps
    noise = (torch.rand(o.shape, device=o.device) - 0.5) * 4 * eps
    return o * (1 + noise).to(o.dtype), state


class _NoisyGradient(torch.autograd.Function):
    """Identity forward; backward perturbs the gradient's last bits (an atomic-add order)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        eps = torch.finfo(grad.dtype).eps
        return grad * (1 + (torch.rand(grad.shape, device=grad.device) - 0.5) * 4 * eps).to(grad.dtype)


@mutant("gla", "determinism")
def gla_nondeterministic_backward(q, k, v, g, **options):
    """dv accumulated with atomics in a varying order: its last bits change from run to run."""
    return naive.gla(q, k, _NoisyGradient.apply(v), g, **options)


# --- law 6: side effects -------------------------------------------------------------------------

@mutant("kda", "no_side_effects")
def kda_gate_cumsum_in_place(q, k, v, g, beta, **options):
    """The chunk-local cumulative sum of the gates is written over the caller's g."""
    out = naive.kda(q, k, v, g, beta, **options)
    g.data.copy_(g.data.cumsum(1) - 1)
    return out


@mutant("gla", "no_side_effects")
def gla_state_updated_in_place(q, k, v, g, *, initial_state=None, **options):
    """The caller's initial state is advanced in place (and, without one, v is rescaled in place)."""
    o, state = naive.gla(q, k, v, g, initial_state=initial_state, **options)
    if initial_state is not None:
        initial_state.data.mul_(0.5)
    else:
        v.data.mul_(2)
    return o, state


@mutant("attention", "no_side_effects")
def attention_unwritten_last_row(q, k, v, **options):
    """The output is allocated with torch.empty and the last query row is never written."""
    o, lse = naive.attention(q, k, v, **options)
    out = torch.empty_like(o)
    out[:, :-1] = o[:, :-1]
    return out, lse


# --- law 7: paths --------------------------------------------------------------------------------

@mutant("kda", "path_agreement", knobs={"use_gather": (True, False)})
def kda_nongather_shifted_gate(q, k, v, g, beta, *, use_gather=True, **options):
    """The non-gather path loads the gates one token late."""
    return naive.kda(q, k, v, g if use_gather else _shift(g, 1), beta, **options)


@mutant("gla", "path_agreement", knobs={"chunk_size": (64, 16)})
def gla_small_chunks_drop_tail(q, k, v, g, *, chunk_size=64, **options):
    """With chunk_size 16 the partial last chunk is dropped (64 is fine for T < 64)."""
    if chunk_size == 64:
        return naive.gla(q, k, v, g, **options)
    return _gla_dropping_partial_chunk(q, k, v, g, **options)


@control("kda", knobs={"use_gather": (True, False), "disable_recompute": (False, True)})
def kda_with_paths(q, k, v, g, beta, *, use_gather=True, disable_recompute=False, **options):
    """Correct: the path knobs change nothing."""
    return naive.kda(q, k, v, g, beta, **options)


# --- law 8: precision modes ----------------------------------------------------------------------

PRECISION = {"precision": ("ieee", "tf32", "tf32x3")}


def _gla_in(mode: str, q, k, v, g, **options):
    """gla with every dot operand as the mode reads it: tf32 truncates q, k, v (fp32 inputs)."""
    if mode == "tf32":
        q, k, v = _tf32(q), _tf32(k), _tf32(v)
    return naive.gla(q, k, v, g, **options)


@control("gla", knobs=PRECISION)
def gla_emulated_precision(q, k, v, g, *, precision="ieee", **options):
    """Correct: tf32 truncates the operands, ieee and tf32x3 keep fp32 accuracy."""
    return _gla_in(precision, q, k, v, g, **options)


@mutant("gla", "precision_modes", knobs=PRECISION)
def gla_precision_ignored(q, k, v, g, *, precision="ieee", **options):
    """The precision knob is accepted and ignored: always ieee."""
    return _gla_in("ieee", q, k, v, g, **options)


@mutant("gla", "precision_modes", knobs=PRECISION)
def gla_tf32_for_tf32x3(q, k, v, g, *, precision="ieee", **options):
    """tf32 where tf32x3 was asked."""
    return _gla_in("tf32" if precision == "tf32x3" else precision, q, k, v, g, **options)


@mutant("gla", "precision_modes", knobs=PRECISION)
def gla_tf32_for_ieee(q, k, v, g, *, precision="ieee", **options):
    """tf32 where ieee was asked (the order ieee <= tf32x3, above the float32 form's noise floor)."""
    return _gla_in("tf32" if precision == "ieee" else precision, q, k, v, g, **options)


@mutant("gla", "precision_modes", knobs=PRECISION)
def gla_always_tf32(q, k, v, g, *, precision="ieee", **options):
    """Every mode runs tf32."""
    return _gla_in("tf32", q, k, v, g, **options)


# --- law 9: fp16 gates ---------------------------------------------------------------------------

@mutant("gla", "fp16_gates")
def gla_fp16_gate_read_as_bf16(q, k, v, g, **options):
    """fp16 gate bits are read as bf16 (a wrong pointer type)."""
    return naive.gla(q, k, v, g.view(torch.bfloat16) if g.dtype == torch.float16 else g, **options)


@mutant("kda", "fp16_gates")
def kda_fp16_gate_through_bf16(q, k, v, g, beta, **options):
    """fp16 gates are converted to bf16 on load, losing 3 mantissa bits."""
    if g.dtype == torch.float16:
        g = g.to(torch.bfloat16).to(torch.float16)
    return naive.kda(q, k, v, g, beta, **options)


# --- law 10: gates -------------------------------------------------------------------------------

@mutant("kda_gate", "gate_bounds")
def gate_overshoots_lower_bound(g, A_log, dt_bias=None, lower_bound=None):
    """The lower-bound gate is scaled by 1 + 2^-5: saturated values fall below lower_bound; the
    softplus gate is shifted up by 1e-3: tiny decays become positive."""
    gate = naive.kda_gate(g, A_log, dt_bias, lower_bound)
    return gate * (1 + 2.0**-5) if lower_bound is not None else gate + 1e-3


@mutant("kda_gate", "gate_bounds")
def gate_sigmoid_unscaled(g, A_log, dt_bias=None, lower_bound=None):
    """The lower-bound form forgets lower_bound's sign (gate in (0, -lower_bound)); softplus form
    forgets the minus sign."""
    return -naive.kda_gate(g, A_log, dt_bias, lower_bound)


@mutant("kda_gate", "gate_monotone")
def gate_increasing_in_g(g, A_log, dt_bias=None, lower_bound=None):
    """The gate input is negated (x = -(g + dt_bias)): the decay weakens as g grows."""
    return naive.kda_gate(-g, A_log, None if dt_bias is None else -dt_bias, lower_bound)


@mutant("kda_gate", "gate_monotone")
def gate_of_abs(g, A_log, dt_bias=None, lower_bound=None):
    """The gate reads |g + dt_bias|: not monotone in g."""
    x = g if dt_bias is None else g + dt_bias.to(g.dtype).view(g.shape[2], g.shape[3])
    return naive.kda_gate(x.abs(), A_log, None, lower_bound)


# --- law 11: attention ---------------------------------------------------------------------------

@mutant("attention", "key_permutation", declines=PLAIN_ATTENTION)
def attention_position_bias(q, k, v, **options):
    """A stray position bias (-0.5 per key position) leaks into the scores."""
    return _attention(q, k, v, bias=-0.5, **options)


@mutant("attention", "key_permutation", declines=PLAIN_ATTENTION)
def attention_sink_on_first_key(q, k, v, **options):
    """The first key gets +2 on its score (an attention sink nobody asked for)."""
    return _attention(q, k, v, sink=2.0, **options)


@mutant("attention", "rows_without_keys", declines=PLAIN_ATTENTION)
def attention_lse_base2(q, k, v, **options):
    """lse in base 2 (log2 sum 2^s) instead of the natural log."""
    o, lse = naive.attention(q, k, v, **options)
    return o, lse * math.log2(math.e)


@mutant("attention", "rows_without_keys", declines=PLAIN_ATTENTION)
def attention_finite_mask(q, k, v, **options):
    """Masked scores set to -1e4 instead of -inf: a row that sees no key averages every value."""
    return _attention(q, k, v, fill=-1e4, **options)


# --- law 12: reads past an input -----------------------------------------------------------------

def _after_the_end(x: torch.Tensor) -> torch.Tensor:
    """The element after ``x``'s last one in memory, as an unmasked load reads it; 0 where ``x``'s
    storage ends there (a tight allocation, where a GPU would read a neighbour's bytes)."""
    after = x.storage_offset() + sum((n - 1) * s for n, s in zip(x.shape, x.stride())) + 1
    if x.numel() == 0 or after >= x.untyped_storage().nbytes() // x.element_size():
        return x.new_zeros(())
    return x.detach().as_strided((), (), after)


@mutant("attention", "reads_past_input")
def attention_v_rows_assumed_dense(q, k, v, **options):
    """v is read with the strides of a contiguous tensor (row stride Dv), not its own: exact on
    contiguous v, a strided v's rows are read across the gaps between them."""
    dense = torch.empty(v.shape, device="meta").stride()
    return naive.attention(q, k, v.as_strided(v.shape, dense), **options)


@mutant("simple_gla", "reads_past_input")
def simple_gla_unmasked_gate_tail(q, k, v, g, **options):
    """The last block of gates is loaded without a mask and its tail zeroed by multiplying with 0:
    the element after g's end enters every output as 0 * value (NaN there: 0 * NaN = NaN)."""
    o, state = naive.simple_gla(q, k, v, g, **options)
    return o + 0 * _after_the_end(g).to(o.dtype), state


# --- law 7 again: an autotune config (Triton, interpreted on the CPU) ------------------------------

gate_autotune_config_drops_tail = Implementation(
    "kda_gate", f"{__name__}:gate_autotune_config_drops_tail", "tests.mutant_kernels:kda_gate_drops_tail",
    backward=False, triton=True, description="A Triton gate kernel whose second autotune config never writes "
                                             "the last partial block (tests/mutant_kernels.py).")
MUTANTS["gate_autotune_config_drops_tail"] = Mutant(gate_autotune_config_drops_tail, ("path_agreement",),
                                                    gate_autotune_config_drops_tail.description)

gate_autotuned = CONTROLS["gate_autotuned"] = Implementation(
    "kda_gate", f"{__name__}:gate_autotuned", "tests.mutant_kernels:kda_gate", backward=False, triton=True,
    description="Correct: the same Triton gate kernel with two correct autotune configs.")


# --- law 13: the head-first layout --------------------------------------------------------------

def _seq_first(x, head_first: bool):
    """``[B, H, T, ...]`` as ``[B, T, H, ...]`` (a view) when ``head_first``."""
    return x.transpose(1, 2) if head_first else x


@control("gla", head_first=True)
def gla_head_first(q, k, v, g, *, head_first=False, **options):
    """Correct: a head-first call transposes its token-axis inputs and o, nothing else."""
    o, state = naive.gla(*(_seq_first(x, head_first) for x in (q, k, v, g)), **options)
    return _seq_first(o, head_first), state


@mutant("gla", "head_first", head_first=True)
def gla_head_first_reshaped(q, k, v, g, *, head_first=False, **options):
    """Head-first inputs reshaped to ``[B, T, H, D]`` instead of transposed: the tokens and heads mix."""
    if head_first:
        q, k, v, g = (x.reshape(x.shape[0], x.shape[2], x.shape[1], *x.shape[3:]) for x in (q, k, v, g))
    o, state = naive.gla(q, k, v, g, **options)
    return _seq_first(o, head_first), state


@mutant("simple_gla", "head_first", head_first=True)
def simple_gla_head_first_gate_reshaped(q, k, v, g, *, head_first=False, **options):
    """q, k, v and o transposed right, the gate ``[B, H, T]`` reshaped to ``[B, T, H]``."""
    if head_first:
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        g = g.reshape(g.shape[0], g.shape[2], g.shape[1])
    o, state = naive.simple_gla(q, k, v, g, **options)
    return _seq_first(o, head_first), state


# --- a kernel that crashes its process on a GPU (issue 13, item 5) -------------------------------

gate_crashes_on_odd_lengths = Implementation(
    "kda_gate", f"{__name__}:gate_crashes_on_odd_lengths", "tests.mutant_kernels:kda_gate_crashes_on_odd_lengths",
    backward=False, triton=True, description="Correct on inputs of even length T; at odd T "
    "a Triton kernel reads 2**36 elements past g (tests/mutant_kernels.py): an illegal memory access on a GPU.")
"""Not a law's mutant: every law meets its crash. It shows that a crash is a finding about its example and
the run goes on (``tests/test_workers.py`` on the CPU, ``benchmarks/gpu.sh crash-isolation`` on a GPU)."""


def gate_exits_on_odd_lengths(g, A_log, dt_bias=None, lower_bound=None):
    """The naive kda_gate, except that at odd T it ends its process with the status of a lost CUDA
    context (``refcheck.runtime.workers.CONTEXT_LOST``): what a crashing GPU kernel does to a worker,
    on the CPU."""
    import os
    if g.shape[1] % 2:
        os._exit(70)
    return naive.kda_gate(g, A_log, dt_bias, lower_bound)


def gate_wrong_at_some_lengths(g, A_log, dt_bias=None, lower_bound=None):
    """The naive kda_gate, negated where T % 3 == 2: Hypothesis's first, simplest example (T = 1) passes,
    so a campaign that fails on its first example replayed it (``tests/test_fuzz.py``)."""
    gate = naive.kda_gate(g, A_log, dt_bias, lower_bound)
    return -gate if g.shape[1] % 3 == 2 else gate


gate_kills_its_process = Implementation(
    "kda_gate", f"{__name__}:gate_kills_its_process", f"{__name__}:gate_exits_on_odd_lengths", backward=False,
    description="Ends its process at odd T, as a kernel that loses the CUDA context ends a GPU worker.")
