"""Softmax attention written from other standard formulas than the reference's, with buggy twins.

User kernels (not registered): ``--impl attention=tests.zoo.attention:NAME``. Every member has the
contract signature ``f(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
window_size=None, softcap=None, sinks=None)``:

    q [B, T, H, Dqk], k [B, S, Hk, Dqk], v [B, S, Hk, Dv], H % Hk == 0 (query head h reads kv head h // (H // Hk));
    packed: B == 1 and cu_seqlens_q / cu_seqlens_k (int32/int64, as many sequences each);
    returns o [B, T, H, Dv] in q.dtype and lse [B, H, T] in float32 (natural log).

Per sequence and head, with scores ``s_ij = scale * q_i . k_j`` (scale defaults to Dqk ** -0.5) and the
causal mask aligned bottom-right (row i sees key j iff ``j <= i + S - T``):

    lse_i = log sum_j exp(s_ij),   o_i = sum_j exp(s_ij - lse_i) v_j;
    a row that sees no key has o_i = 0 and lse_i = -inf exactly (and zero gradients).

A window (left, right) keeps the keys with ``-left <= j - (i + S - T) <= right`` (an index test of its own,
``_visible``); a softcap caps the scaled scores ``c tanh(s / c)`` (the flash backward multiplies dS by
``1 - tanh^2``); sinks enter as one more key of value 0 after the last key block (online softmax) or as a
last column of logsumexp (textbook), not as the reference starts its running softmax at the sink.

Online softmax (``_online``) walks key blocks of ``block`` keys keeping a running max ``m``, running sum
``l`` and accumulator ``acc``:

    m' = max(m, rowmax(s_blk)),  a = exp(m - m'),  P = exp(s_blk - m'),
    l' = a l + rowsum(P),        acc' = a acc + P V_blk,      o = acc / l,  lse = m + log l;

``m`` is detached: o and lse do not depend on it, so autograd differentiates the rest exactly.
Scores, P, l and acc are fp32 (q, k, v upcast); ``p_in_dtype`` rounds P to the input dtype before
``P V`` (operands in the input dtype, fp32 accumulation), as flash kernels do. The flash backward
(``_FlashAttention``) recomputes ``P = exp(s - lse)`` and, with the upstream gradients dO, dlse:

    dP = dO V^T,  D = rowsum(dO * O),  dS = P * (dP - D + dlse),
    dq = scale dS K,  dk = scale dS^T Q,  dv = P^T dO

(``dlse`` enters because lse is an output). The buggy twins change one rule (``Rules``) or drop the
rescale; their docstrings say "BUG".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from refcheck.references.attention import check_attention_inputs
from refcheck.references.contract import check_scale

NEG_INF = float("-inf")
COMPUTE = torch.float32

Core = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]
"""``core(q [H, T, Dqk], k [H, S, Dqk], v [H, S, Dv], visible [T, S] bool, scale) -> (o [H, T, Dv], lse [H, T] fp32)``."""


# --- the contract's index rules (a buggy twin breaks one) ------------------------------------------

def _bottom_right(t: int, s: int) -> int:
    return s - t


def _top_left(t: int, s: int) -> int:
    return 0


def _grouped(h: int, hk: int) -> torch.Tensor:
    return torch.arange(h) // (h // hk)


def _modulo(h: int, hk: int) -> torch.Tensor:
    return torch.arange(h) % hk


@dataclass(frozen=True)
class Rules:
    """How rows meet keys: the causal offset (row i sees key j iff j <= i + offset(T, S)), the kv head
    of each query head, whether a packed sequence also sees the key before its span, and the factor
    applied to the returned lse (1: natural log)."""

    causal_offset: Callable[[int, int], int] = _bottom_right
    kv_heads: Callable[[int, int], torch.Tensor] = _grouped
    leak_previous_key: bool = False
    lse_factor: float = 1.0


CONTRACT = Rules()


def _visible(t: int, s: int, causal: bool, offset: int, device, window=None) -> torch.Tensor:
    """``[T, S]``: whether row i sees key j: ``j <= i + offset`` where causal, and within
    ``[i + offset - left, i + offset + right]`` with a window (a side None: unbounded)."""
    i = torch.arange(t, device=device).unsqueeze(1)
    j = torch.arange(s, device=device).unsqueeze(0)
    seen = torch.ones(t, s, dtype=torch.bool, device=device)
    if causal:
        seen = seen & (j - i <= offset)
    left, right = window if window is not None else (None, None)
    if left is not None:
        seen = seen & (i + offset - j <= left)
    if right is not None:
        seen = seen & (j - i - offset <= right)
    return seen


def _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, core: Core, rules: Rules = CONTRACT, *,
               window_size=None, softcap=None, sinks=None):
    """Validate, split into sequences, gather each query head's kv head, run ``core`` per sequence and
    put the pieces back: o ``[B, T, H, Dv]`` in q.dtype, lse ``[B, H, T]`` fp32. The core gets the
    softcap and the sinks (fp32) as keywords where given."""
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    scale = check_scale(scale, q.shape[-1])
    extra = {}
    if softcap is not None:
        extra["softcap"] = float(softcap)
    if sinks is not None:
        extra["sinks"] = sinks.to(COMPUTE)
    heads = rules.kv_heads(q.shape[2], k.shape[2]).to(q.device)
    o_parts: list[list[torch.Tensor]] = [[] for _ in range(q.shape[0])]
    lse_parts: list[list[torch.Tensor]] = [[] for _ in range(q.shape[0])]
    for row, (qs, qe), (ks, ke) in pairs:
        visible = _visible(qe - qs, ke - ks, causal, rules.causal_offset(qe - qs, ke - ks), q.device, window_size)
        if rules.leak_previous_key and ks > 0:
            ks -= 1
            visible = torch.cat([visible.new_ones(qe - qs, 1), visible], dim=1)
        qi = q[row, qs:qe].transpose(0, 1)                                  # [H, T, Dqk]
        kj = k[row, ks:ke].index_select(1, heads).transpose(0, 1)           # [H, S, Dqk]
        vj = v[row, ks:ke].index_select(1, heads).transpose(0, 1)           # [H, S, Dv]
        o, lse = core(qi, kj, vj, visible, scale, **extra)
        o_parts[row].append(o.to(q.dtype).transpose(0, 1))                  # [T, H, Dv]
        lse_parts[row].append(lse.float() * rules.lse_factor)            # [H, T]
    return (torch.stack([torch.cat(p) for p in o_parts]),
            torch.stack([torch.cat(p, dim=1) for p in lse_parts]))


# --- cores ----------------------------------------------------------------------------------------

def _scores(qi, kj, visible, scale, softcap=None) -> torch.Tensor:
    """fp32 ``scale * q k^T`` (q, k upcast), capped ``c tanh(s / c)`` with a softcap, -inf where a row does
    not see a key."""
    s = scale * (qi.to(COMPUTE) @ kj.to(COMPUTE).transpose(-1, -2))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    return s.masked_fill(~visible, NEG_INF)


def _online(qi, kj, vj, visible, scale, *, block: int, p_in_dtype: bool = False, rescale: bool = True,
            softcap=None, sinks=None):
    """Online softmax over key blocks of ``block`` (module docstring); ``rescale=False`` is the bug of
    not multiplying the accumulator by ``exp(m - m')``. At least one (possibly empty) block runs, so
    that the outputs depend on q, k, v even when S == 0 (gradients zero, not missing). Sinks are folded
    in after the last block, as one more key of value 0: ``m' = max(m, sink)``, ``l' = e^(m-m') l + e^(sink-m')``,
    ``acc' = e^(m-m') acc``."""
    h, t, s = qi.shape[0], qi.shape[1], kj.shape[1]
    m = qi.new_full((h, t), NEG_INF, dtype=COMPUTE)
    l = qi.new_zeros((h, t), dtype=COMPUTE)
    acc = qi.new_zeros((h, t, vj.shape[-1]), dtype=COMPUTE)
    for start in range(0, max(s, 1), block):
        sb = _scores(qi, kj[:, start:start + block], visible[:, start:start + block], scale, softcap)
        blk_max = sb.detach().amax(-1) if sb.shape[-1] else m
        m_new = torch.maximum(m, blk_max)
        m_safe = torch.where(torch.isfinite(m_new), m_new, 0.0)       # a row that saw no key yet
        alpha = torch.exp(m - m_safe)                                   # 0 while m = -inf
        p = torch.exp(sb - m_safe.unsqueeze(-1))
        pv = p.to(qi.dtype).to(COMPUTE) if p_in_dtype else p
        l = alpha * l + p.sum(-1)
        acc = (alpha.unsqueeze(-1) * acc if rescale else acc) + pv @ vj[:, start:start + block].to(COMPUTE)
        m = m_new
    if sinks is not None:
        sink = sinks.view(-1, 1).expand(h, t)
        m_new = torch.maximum(m, sink.detach())
        m_safe = torch.where(torch.isfinite(m_new), m_new, 0.0)
        alpha = torch.exp(m - m_safe)
        l = alpha * l + torch.exp(sink - m_safe)
        acc = alpha.unsqueeze(-1) * acc
        m = m_new
    seen = l > 0                                                        # l >= 1 on a row that saw a key
    l_safe = torch.where(seen, l, 1.0)
    lse = torch.where(seen, torch.where(seen, m, 0.0) + torch.log(l_safe), NEG_INF)
    return acc / l_safe.unsqueeze(-1), lse


def _dense(qi, kj, vj, visible, scale, softcap=None, sinks=None):
    """Textbook: fp32 scores, ``lse = logsumexp(s)`` (with sinks, over the scores and a last column of the
    sinks), ``o = exp(s - lse) V``, autograd through all of it (rows that see nothing are fed zeros to
    logsumexp, so that its backward stays NaN-free)."""
    s = _scores(qi, kj, visible, scale, softcap)
    seen = visible.any(-1).expand(s.shape[:2])                          # [H, T]
    full = s
    if sinks is not None:
        full = torch.cat([s, sinks.view(-1, 1, 1).expand(*s.shape[:2], 1)], -1)
        seen = seen | torch.isfinite(sinks).view(-1, 1)
    lse = torch.where(seen, torch.logsumexp(torch.where(seen.unsqueeze(-1), full, 0.0), -1), NEG_INF)
    p = torch.exp(s - torch.where(seen, lse, 0.0).unsqueeze(-1))
    return p @ vj.to(COMPUTE), lse


class _FlashAttention(torch.autograd.Function):
    """One sequence: forward = online softmax over key blocks of 64, saving o and lse; backward = the
    flash backward of the module docstring, P and dS rounded to the input dtype before the dots when
    ``round_p``, fp32 otherwise (accumulation fp32 in both)."""

    @staticmethod
    def forward(ctx, qi, kj, vj, sinks, visible, scale, round_p, softcap):
        o, lse = _online(qi, kj, vj, visible, scale, block=64, p_in_dtype=round_p, softcap=softcap, sinks=sinks)
        o = o.to(qi.dtype)
        ctx.save_for_backward(qi, kj, vj, visible, o, lse, *(() if sinks is None else (sinks,)))
        ctx.scale, ctx.round_p, ctx.softcap = scale, round_p, softcap
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        qi, kj, vj, visible, o, lse, *sinks = ctx.saved_tensors
        scale, softcap = ctx.scale, ctx.softcap
        rounded = (lambda x: x.to(qi.dtype).to(COMPUTE)) if ctx.round_p else (lambda x: x)
        do = torch.zeros_like(o, dtype=COMPUTE) if do is None else do.to(COMPUTE)
        dlse = torch.zeros_like(lse) if dlse is None else dlse.to(COMPUTE)
        q32, k32, v32 = qi.to(COMPUTE), kj.to(COMPUTE), vj.to(COMPUTE)
        base = torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1)
        p = torch.exp(_scores(qi, kj, visible, scale, softcap) - base)
        dp = do @ v32.transpose(-1, -2)
        d = (do * o.to(COMPUTE)).sum(-1, keepdim=True)
        ds = p * (dp - d + dlse.unsqueeze(-1))
        if softcap is not None:            # d(c tanh(r / c)) / dr = 1 - tanh(r / c)^2, r = scale q k^T
            raw = scale * (q32 @ k32.transpose(-1, -2))
            ds = ds * (1 - torch.tanh(raw / softcap) ** 2)
        ds = rounded(ds)
        dq = scale * (ds @ k32)
        dk = scale * (ds.transpose(-1, -2) @ q32)
        dv = rounded(p).transpose(-1, -2) @ do
        dsinks = None
        if sinks:                          # the sink's column: P = exp(sink - lse), dP = 0 (its value is 0)
            p_sink = torch.where(torch.isfinite(lse), torch.exp(sinks[0].view(-1, 1) - base.squeeze(-1)), 0.0)
            dsinks = (p_sink * (dlse - d.squeeze(-1))).sum(-1)
        return dq.to(qi.dtype), dk.to(kj.dtype), dv.to(vj.dtype), dsinks, None, None, None, None


def _flash(qi, kj, vj, visible, scale, *, round_p: bool, softcap=None, sinks=None):
    return _FlashAttention.apply(qi, kj, vj, sinks, visible, scale, round_p, softcap)


def _extensions(window_size, softcap, sinks) -> dict:
    return {"window_size": window_size, "softcap": softcap, "sinks": sinks}


# --- correct members ------------------------------------------------------------------------------

def online_softmax_b16(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                       softcap=None, sinks=None):
    """Online softmax over key blocks of 16: m' = max(m, rowmax s), l' = e^(m-m') l + sum P,
    acc' = e^(m-m') acc + P V, o = acc / l, lse = m + log l; scores and P fp32; autograd backward."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_online, block=16),
                      **_extensions(window_size, softcap, sinks))


def online_softmax_b128_p_input(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                                softcap=None, sinks=None):
    """Online softmax over key blocks of 128 with P rounded to the input dtype before P V (fp32
    accumulation, l summed from the fp32 P), as flash kernels do; autograd backward."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_online, block=128, p_in_dtype=True),
                      **_extensions(window_size, softcap, sinks))


def flash_backward_fp32(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                        softcap=None, sinks=None):
    """Online-softmax forward (blocks of 64) saving o, lse; flash backward P = exp(s - lse), dP = dO V^T,
    D = rowsum(dO O), dS = P (dP - D + dlse), dq = scale dS K, dk = scale dS^T Q, dv = P^T dO, all fp32."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_flash, round_p=False),
                      **_extensions(window_size, softcap, sinks))


def flash_backward_input_dtype(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                               softcap=None, sinks=None):
    """``flash_backward_fp32`` with P (forward and backward) and dS rounded to the input dtype before
    their dots (operands in the input dtype, fp32 accumulation), as real flash kernels do."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_flash, round_p=True),
                      **_extensions(window_size, softcap, sinks))


def dense_textbook(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                   softcap=None, sinks=None):
    """s = scale q k^T in fp32, lse = torch.logsumexp(s), o = exp(s - lse) V (dense); autograd backward."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _dense,
                      **_extensions(window_size, softcap, sinks))


# --- buggy twins ----------------------------------------------------------------------------------

_B16 = partial(_online, block=16)


def bug_causal_top_left(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                        softcap=None, sinks=None):
    """BUG: the causal mask aligned top-left (row i sees key j iff j <= i), wrong whenever S != T."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(causal_offset=_top_left),
                      **_extensions(window_size, softcap, sinks))


def bug_gqa_head_modulo(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                        softcap=None, sinks=None):
    """BUG: query head h reads kv head h % Hk instead of h // (H // Hk) (wrong when 1 < Hk < H)."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(kv_heads=_modulo),
                      **_extensions(window_size, softcap, sinks))


def bug_varlen_key_leak(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                        softcap=None, sinks=None):
    """BUG: every packed sequence after the first also sees the key just before its span (the previous
    sequence's last key), visible to all its rows."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(leak_previous_key=True),
                      **_extensions(window_size, softcap, sinks))


def bug_no_rescale(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                   softcap=None, sinks=None):
    """BUG: online softmax (blocks of 16) that rescales l but not the accumulator when the running max
    grows: acc' = acc + P V; wrong only where a later key block raises a row's max."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_online, block=16, rescale=False),
                      **_extensions(window_size, softcap, sinks))


def bug_lse_log2(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                 softcap=None, sinks=None):
    """BUG: lse returned in base 2, log2 sum_j exp(s_ij) = lse / ln 2 (o is right)."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(lse_factor=1 / math.log(2)),
                      **_extensions(window_size, softcap, sinks))
