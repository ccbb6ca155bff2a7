"""The record of ``attention`` (softmax attention: flash attention, MLA, GQA, varlen).

Math, shapes and options: ``references/attention.py`` (float64 truth). Budgets: ``[attention.*]`` in
``tolerances.toml``. Laws: every law whose traits the record has (varlen, causal, keys),
``refcheck/engine/laws.py``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from refcheck import references
from refcheck.references.attention import Mask, check_attention_inputs

from ...strategies import (
    EMPTY,
    SMALL,
    Limits,
    dtypes,
    fit,
    head_dims_of,
    lengths,
    picker,
    scales,
    seeds,
    seqlens,
)
from ..case import PRECISION_MODES, Case
from ..implementation import Implementation
from .card import Extension, Grouping, Inputs, OpCard, Template, Templates, sweep_lengths
from .inputs import cu_seqlens, normal, rounded
from .linear import LINEAR_DTYPES

DTYPES = LINEAR_DTYPES

MLA_DIMS = (192, 128)
"""Dqk, Dv of multi-head latent attention."""

GQA_GROUPS = (1, 2, 4, 3)
"""Query heads per key head."""

TRITON_KNOBS = {"precision": PRECISION_MODES, "block_m": (128, 64), "schedule": ("grid", "persistent")}
"""Our kernel's knobs (``optimized.attention``): fp32 dot precision, query rows per forward program, the
forward's schedule (a program per tile, or persistent programs looping over tiles)."""


def make_inputs(case: Case, device) -> Inputs:
    """q ``[B, T, H, Dqk]``, k ``[B, S, Hk, Dqk]``, v ``[B, S, Hk, Dv]``; packed: cu_seqlens_q and
    cu_seqlens_k; with sinks, ``sinks [H]`` float32 (N(0, 2^2): logits about a score's size)."""
    d = case.dim
    gen = torch.Generator().manual_seed(case.seed)
    b, t, s, h, hk, dqk, dv = (d[n] for n in ("B", "T", "S", "H", "Hk", "Dqk", "Dv"))
    dt = case.torch_dtype
    tensors = {"q": rounded(normal(gen, (b, t, h, dqk), device), dt),
               "k": rounded(normal(gen, (b, s, hk, dqk), device), dt),
               "v": rounded(normal(gen, (b, s, hk, dv), device), dt)}
    if case.seqlens is not None:
        tensors["cu_seqlens_q"] = cu_seqlens(case, case.seqlens, device)
        tensors["cu_seqlens_k"] = cu_seqlens(case, case.seqlens_k, device)
    if case.drawn.get("sinks"):
        tensors["sinks"] = normal(gen, (h,), device, 2.0)
    return Inputs(tensors, ("q", "k", "v"), case.opts)


WINDOW = Extension("window", ("window_size",), "a sliding window: window_size = (left, right) keys around each "
                   "row's diagonal, a side None unbounded (Mistral, Gemma 2 and 3, gpt-oss)")
SOFTCAP = Extension("softcap", ("softcap",), "logit softcap: scores softcap * tanh(s / softcap), after the scale "
                    "(Gemma 2, Grok)")
SINKS = Extension("sinks", ("sinks",), "attention sinks: sinks [H], a per-head logit in every row's softmax "
                  "denominator, a key of value 0 (gpt-oss); it has a gradient", uses=lambda case: bool(case.drawn.get("sinks")))
SOFTCAPS = (1.0, 5.0, 50.0)
"""Softcaps drawn: squashing most scores, some, almost none (Gemma 2's 50)."""


def window_sides(t: int, s: int, causal: bool) -> st.SearchStrategy:
    """A window (left, right) for T queries and S keys: the left side mostly a few keys (what a window
    is about), else up to past the sequence, or None; the right side the same (causal: None or 0, as the
    diagonal bounds it anyway); not both None."""
    reach = max(t, s, 1)
    near = st.integers(0, min(reach, 4))
    left = st.one_of(near, near, st.integers(0, reach + 1), st.none())
    right = st.one_of(st.none(), st.just(0)) if causal else st.one_of(st.none(), near, st.integers(0, reach + 1))
    return st.tuples(left, right).filter(lambda w: w != (None, None))


# --- fp8 forward: budgets [attention.{o,lse}.fp8e4m3|fp8e5m2], ours only (no law draws fp8 cases) --

FP8_DTYPES = ("fp8e4m3", "fp8e5m2")
"""Operand formats of an fp8 forward (``optimized.attention`` with per-tensor descales)."""


def fp8_inputs(case: Case, device) -> tuple[dict[str, torch.Tensor | float], dict[str, torch.Tensor]]:
    """The inputs of an fp8 ``case`` as an fp8 kernel takes them, and the values they hold.

    q, k, v are drawn as for fp32 and quantized per tensor, the largest magnitude to the format's
    largest finite value: the kernel gets ``x / x_descale`` in fp8 and the ``x_descale`` keywords,
    the truth and the naive form the values ``stored * x_descale`` in float64 (cu_seqlens in both)."""
    drawn = make_inputs(case.replace(dtype="fp32"), device).tensors
    fp8 = case.torch_dtype
    kernel: dict[str, torch.Tensor | float] = dict(drawn)
    held = dict(drawn)
    for name in ("q", "k", "v"):
        descale = float(drawn[name].abs().max()) / torch.finfo(fp8).max
        stored = (drawn[name] / descale).to(fp8)
        kernel[name], kernel[f"{name}_descale"] = stored, descale
        held[name] = stored.double() * descale
    return kernel, held


@st.composite
def cases(draw, impl=None, limits: Limits = SMALL, *, min_len: int = 1,
                    varlen: bool | None = None, min_seqs: int = 1, min_batch: int = 1, dtype: str | None = None,
                    causal: bool | None = None, min_keys: int = 1, rows_without_keys: bool = False,
                    grouped: bool | None = None, window: bool | None = None, sinks: bool | None = None,
                    pinned: Mapping = EMPTY,
                    declined: frozenset = frozenset()) -> Case:
    """A case of attention: GQA (H = Hk * group), Dqk != Dv (MLA's 192/128 included), T != S,
    causal or not, batched or packed with separate query and key lengths (empty spans included); a
    sliding window, a softcap and sinks, each a third of the time, unless declined (no sinks where rows
    without keys are asked for: their lse is then -inf, what law 11 checks)."""
    pick = picker(draw, pinned)
    dt = pick("dtype", dtypes(DTYPES, impl, dtype))
    hk = pick("Hk", st.integers(1, limits.max_heads))
    groups = [g for g in GQA_GROUPS if grouped is None or (g > 1) == grouped]
    h = pick("H", st.sampled_from(groups).map(lambda group: hk * group))
    pairs = st.tuples(*(head_dims_of(impl, dt, n, limits.max_dim) for n in ("Dqk", "Dv")))
    if limits.mla:
        pairs = st.one_of(pairs, st.just(MLA_DIMS))
    dqk, dv = (pinned["Dqk"], pinned["Dv"]) if "Dqk" in pinned else draw(pairs)
    if rows_without_keys:
        causal, min_len = True, max(min_len, 2)
    is_causal = pick("causal", st.booleans() if causal is None else st.just(causal))
    if min_batch > 1:
        varlen = False
    packed = pick("packed", st.booleans() if varlen is None else st.just(varlen))
    seqs = seqs_k = None
    if packed:
        b = 1
        cap = fit(limits, 1, h, dqk + dv, max(min_len, min_keys))
        seqs = draw(seqlens(cap, limits.max_seqs, min_seqs=min_seqs, min_total=min_len, min_nonempty=min(min_seqs, 2)))
        n = len(seqs)
        seqs_k = draw(st.lists(st.integers(0, max(min_keys, cap // n)), min_size=n, max_size=n))
        if max(seqs_k) < min_keys:                          # construct: one span with enough keys
            seqs_k[draw(st.integers(0, n - 1))] = min_keys
        if rows_without_keys:                               # a query span longer than its key span
            i = max(range(n), key=lambda j: seqs[j])
            seqs_k[i] = draw(st.integers(0, seqs[i] - 1))
            if sum(seqs_k) == 0:                            # keep S >= 1 (seqs[i] >= 2 when n == 1)
                seqs_k[(i + 1) % n if n > 1 else i] = 1
        t, s, seqs_k = sum(seqs), sum(seqs_k), tuple(seqs_k)
    else:
        b = draw(st.integers(min_batch, max(min_batch, limits.max_batch)))
        cap = fit(limits, b, h, dqk + dv, max(min_len, min_keys))
        t = draw(lengths(min_len, cap))
        if rows_without_keys:                               # causal is bottom-right: S < T
            s = draw(st.integers(max(1, min(min_keys, t - 1)), t - 1))
        elif draw(st.booleans()) and t >= min_keys:
            s = t
        else:
            s = draw(lengths(min_keys, cap))
    options = {"causal": is_causal, "scale": pick("scale", scales())}
    drawn = {"cu_dtype": pick("cu_dtype", st.sampled_from(["int32", "int64"]))} if packed else {}

    def extension(name: str, key: str, values: st.SearchStrategy, wanted: bool | None = None):
        if name in declined or wanted is False:
            return None
        return pick(key, values if wanted else st.one_of(st.none(), st.none(), values), absent=None)
    longest = max(seqs or (t,)), max(seqs_k or (s,))
    sides = extension(WINDOW.name, "window_size", window_sides(*longest, is_causal), window)
    if sides is not None:
        options["window_size"] = sides
    cap = extension(SOFTCAP.name, "softcap", st.sampled_from(SOFTCAPS))
    if cap is not None:
        options["softcap"] = cap
    if extension(SINKS.name, "sinks", st.just(True), False if rows_without_keys else sinks):
        drawn["sinks"] = True
    dims = {"B": b, "T": t, "S": s, "H": h, "Hk": hk, "Dqk": dqk, "Dv": dv}
    return Case.make("attention", dims, dt, draw(seeds()), seqlens=seqs, seqlens_k=seqs_k, options=options, draw=drawn)


def grid(quick: bool) -> Templates:
    """A causal GQA batch with more queries than keys (its first rows see no key); packed non-causal
    sequences (one empty query span) with as many key heads as query heads, so that a kernel that
    refuses the backward of GQA with Dqk != Dv (flash-attn-4) has its gradients checked there, and with
    a given scale (0.3, not the default); a causal sliding window of 12 keys; a softcap of 5; sinks, with
    rows that see no key (their lse is the sink); causal sweep with S = T."""
    base: list[Template]
    if quick:
        base = [("dense", dict(B=1, T=12, S=16, H=2, Hk=1, Dqk=16, Dv=8), dict(options={"causal": True}))]
    else:
        dims = dict(T=40, S=50, H=4, Hk=2, Dqk=32, Dv=24)
        base = [("dense", dict(dims, B=2, T=50, S=40), dict(options={"causal": True})),
                ("varlen", dict(dims, B=1, Hk=4), dict(seqlens=(13, 0, 27), seqlens_k=(20, 5, 25),
                                                       options={"scale": 0.3})),
                # the extensions, one case each (a kernel may offer one and decline another)
                ("window", dict(dims, B=1, T=50, S=50), dict(options={"causal": True, "window_size": (12, None)})),
                ("softcap", dict(dims, B=1), dict(options={"softcap": 5.0})),
                ("sinks", dict(dims, B=1, T=50, S=40), dict(options={"causal": True}, draw={"sinks": True}))]
    sweep_dims = dict(B=1, H=2, Hk=1, Dqk=16, Dv=8) if quick else dict(B=1, H=2, Hk=1, Dqk=32, Dv=32)
    return base, [(f"T={t}", dict(sweep_dims, T=t, S=t), dict(options={"causal": True}))
                  for t in sweep_lengths(quick)]


def boundary(t: int, dtype: str, packed: bool, batch: int, require: Mapping) -> tuple[dict, dict]:
    """``t`` queries and keys (packed: a 1-token sequence, then ``t``), two query heads on one key
    head, head dims 16, causal unless asked otherwise."""
    total = t + 1 if packed else t
    dims = {"B": 1 if packed else batch, "T": total, "S": total, "H": 2, "Hk": 1, "Dqk": 16, "Dv": 16}
    seqs = (1, t) if packed else None
    return dims, dict(seqlens=seqs, seqlens_k=seqs, options={"causal": require.get("causal", True)})


def _spans(case: Case) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    return CARD.spans(case) if case.seqlens is not None else [((0, case.dim["T"]), (0, case.dim["S"]))]


def _keys_unseen(case: Case, first: int, last: int) -> torch.Tensor:
    """``[S]`` bool: the keys no query position in ``first .. last`` sees (outside each row's window,
    after its diagonal where causal, in another packed sequence): ``references.attention.Mask``, per sequence."""
    hidden = torch.ones(case.dim["S"], dtype=torch.bool)
    window, is_causal = case.opts.get("window_size"), bool(case.opts.get("causal"))
    for (qs, qe), (ks, ke) in _spans(case):
        rows = range(max(first, qs) - qs, min(last + 1, qe) - qs)
        if not rows:
            continue
        mask = Mask(qe - qs, ke - ks, is_causal, window).visible(qe - qs, 0, ke - ks, "cpu")
        hidden[ks:ke] = False if mask is None else ~mask[rows.start:rows.stop].any(0)
    return hidden


def after(case: Case, cut: int) -> dict[str, torch.Tensor]:
    """Queries after ``cut`` and every key no query row ``<= cut`` sees (per packed sequence)."""
    return {"q": torch.arange(case.dim["T"]) > cut, "k": _keys_unseen(case, 0, cut)}


def empty_outputs(case: Case, x: Inputs, length: int, n: int, provides) -> dict:
    """A query span without keys (or without queries): o = 0 and lse = -inf on its rows (with sinks: lse =
    the sink of each head, whose gradient then gets the upstream gradient of lse), and their dq = 0."""
    d, ref = case.dim, x.tensors["q"]
    out = {"o": ref.new_zeros(1, length, d["H"], d["Dv"], dtype=case.torch_dtype)}
    if "lse" in provides:
        sinks = x.tensors.get("sinks")
        out["lse"] = (torch.full((1, d["H"], length), -math.inf, device=ref.device) if sinks is None
                      else sinks.float().view(1, -1, 1).expand(1, d["H"], length))
    return out


def unseen(case: Case, row: int) -> torch.Tensor:
    """``[S]`` bool: the keys query position ``row`` does not see."""
    return _keys_unseen(case, row, row)


# --- peers: torch SDPA, flex_attention and flash-attn-4, renamed arguments and reshapes only ----

def _peer_sees(i, j, t: int, s: int, causal: bool, window) -> torch.Tensor:
    """Whether query row i of t sees key j of s (broadcast index tensors), written apart from the reference's
    ``Mask`` for the peers' masks: key j's distance past row i's diagonal (bottom-right), at most 0 where
    causal, within the window's ``(left, right)`` sides (None: unbounded)."""
    d = j - i - (s - t)
    ok = d <= 0 if causal else torch.ones_like(d, dtype=torch.bool)
    if window[0] is not None:
        ok = ok & (d >= -window[0])
    if window[1] is not None:
        ok = ok & (d <= window[1])
    return ok


def sdpa_attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                   sinks=None):
    """torch SDPA per sequence (GQA by repeating heads); no lse. The causal mask (bottom-right) and a sliding
    window as an explicit boolean mask; sinks as one more key of value 0 whose score is the sink: q and k get
    one more channel, 1 for q and 0 for the keys, ``sinks[h] / scale`` for the sink key (so that
    ``scale * q.k = sinks[h]``): the law "a sink is a key", as a peer."""
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    groups = q.shape[2] // k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    window = window_size or (None, None)
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    for row, (qs, qe), (ks, ke) in pairs:
        qi = q[row, qs:qe].transpose(0, 1)
        kj = k[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)
        vj = v[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)
        mask = None
        if causal or window_size is not None:
            mask = _peer_sees(torch.arange(qe - qs, device=q.device).unsqueeze(1),
                              torch.arange(ke - ks, device=q.device).unsqueeze(0), qe - qs, ke - ks, causal, window)
        if sinks is not None:
            h = qi.shape[0]
            qi = torch.cat([qi, qi.new_ones(h, qi.shape[1], 1)], -1)
            sink_key = torch.cat([kj.new_zeros(h, 1, kj.shape[-1]), (sinks.to(kj.dtype) / scale).view(h, 1, 1)], -1)
            kj = torch.cat([torch.cat([kj, kj.new_zeros(h, kj.shape[1], 1)], -1), sink_key], 1)
            vj = torch.cat([vj, vj.new_zeros(h, 1, vj.shape[-1])], 1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
        o = F.scaled_dot_product_attention(qi, kj, vj, attn_mask=mask, scale=scale)
        out[row, qs:qe] = o.transpose(0, 1)
    return out, None


def flex_attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                   softcap=None):
    """PyTorch's ``flex_attention`` per sequence (eager: its unfused implementation; GQA by ``enable_gqa``): the
    causal mask (bottom-right) and a sliding window as a ``mask_mod`` of a block mask, the softcap as a
    ``score_mod``; o and lse. It has no sinks. On the CPU its backward refuses (``flex_backward_refusal``)."""
    import warnings

    from torch.nn.attention import flex_attention as flex
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    window = window_size or (None, None)
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), -math.inf, device=q.device)
    score_mod = None if softcap is None else (lambda s, b, h, i, j: softcap * torch.tanh(s / softcap))
    for row, (qs, qe), (ks, ke) in pairs:
        t, s = qe - qs, ke - ks
        if t == 0 or s == 0:
            continue

        def keep(b, h, i, j, t=t, s=s):
            return _peer_sees(i, j, t, s, causal, window)
        masked = causal or window_size is not None
        block = flex.create_block_mask(keep, B=None, H=None, Q_LEN=t, KV_LEN=s, device=q.device) if masked else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # "called without torch.compile()": the unfused form, on purpose
            o, aux = flex.flex_attention(q[row:row + 1, qs:qe].transpose(1, 2), k[row:row + 1, ks:ke].transpose(1, 2),
                                         v[row:row + 1, ks:ke].transpose(1, 2), score_mod=score_mod, block_mask=block,
                                         scale=scale, enable_gqa=True, return_aux=flex.AuxRequest(lse=True))
        out[row, qs:qe] = o[0].transpose(0, 1)
        lse[row, :, qs:qe] = aux.lse[0].float()
    return out, lse


def flex_backward_refusal(device: str, case=None) -> str | None:
    """flex_attention raises "FlexAttention does not support backward on CPU" (torch 2.13)."""
    return "flex_attention: 'does not support backward on CPU'" if torch.device(device).type == "cpu" else None


def fa4_attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                  softcap=None, sinks=None):
    """flash-attn-4 ``flash_attn_func`` / ``flash_attn_varlen_func``: o and lse (``[B, H, T]``;
    packed, its ``[H, total]`` gets the batch axis of one). Its ``window_size`` is ours (bottom-right, None
    unbounded, causal bounding the right side at 0), ``softcap`` the same function, ``learnable_sink`` our sinks."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    options = dict(softmax_scale=scale, causal=causal, window_size=tuple(window_size or (None, None)),
                   softcap=0.0 if softcap is None else softcap, learnable_sink=sinks, return_lse=True)
    if cu_seqlens_q is None:
        return flash_attn_func(q, k, v, **options)
    lengths_q, lengths_k = cu_seqlens_q.diff(), cu_seqlens_k.diff()
    o, lse = flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=cu_seqlens_q.int(), cu_seqlens_k=cu_seqlens_k.int(),
                                    max_seqlen_q=int(lengths_q.max()) if len(lengths_q) else 0,
                                    max_seqlen_k=int(lengths_k.max()) if len(lengths_k) else 0, **options)
    return o.unsqueeze(0), lse.unsqueeze(0)


def fa4_backward_refusal(device: str, case=None) -> str | None:
    """Why flash-attn-4 refuses the backward of ``case``, or None: with GQA (H != Hk) it asserts
    "GQA backward requires head_dim == head_dim_v" (4.0.0b36), so MLA's 192/128 with GQA is
    checked forward only."""
    if case is None:
        return None
    d = case.dim
    if d["H"] != d["Hk"] and d["Dqk"] != d["Dv"]:
        return "flash-attn-4: 'GQA backward requires head_dim == head_dim_v'"
    return None


CARD = OpCard(
    "attention", references.attention, references.attention_chunked, ("o", "lse"), ("q", "k", "v", "sinks"), DTYPES,
    make_inputs, cases=cases,
    traits=frozenset({"varlen", "causal", "keys", "grouped_heads"}), grid=grid, boundary=boundary,
    grouping=Grouping(("k", "v"), "Hk", "H"), extensions=(WINDOW, SOFTCAP, SINKS), shared_inputs=("sinks",),
    token_axes={"q": "q", "k": "k", "v": "k"}, join_dims={"o": 1, "lse": 2},
    causal=lambda case: bool(case.opts.get("causal")), after=after, unseen=unseen, empty_outputs=empty_outputs,
    implementations=(
        Implementation("attention", "triton", "refcheck.optimized:attention", knobs=TRITON_KNOBS, triton=True,
                       description="our Triton flash attention (FA2 schedule, deterministic backward)"),
        Implementation("attention", "sdpa", "refcheck.model.ops.attention:sdpa_attention", outputs=("o",),
                       description="torch scaled_dot_product_attention (no lse)"),
        Implementation("attention", "flex", "refcheck.model.ops.attention:flex_attention",
                       backward_refusal="refcheck.model.ops.attention:flex_backward_refusal",
                       description="torch flex_attention, unfused (masks and softcap as mask_mod and score_mod)"),
        # "head_dim and head_dim_v must be between 8 and 256 and divisible by 8" (flash-attn-4 4.0.0b36 on SM90)
        Implementation("attention", "fa4", "refcheck.model.ops.attention:fa4_attention", devices=("cuda",),
                       dtypes=("bf16", "fp16"), requires="flash_attn", dim_multiple={"bf16": 8, "fp16": 8},
                       backward_refusal="refcheck.model.ops.attention:fa4_backward_refusal",
                       description="flash-attn-4 (CUTLASS DSL)"),
    ))
