"""Public ``attention``: the contract signature of ``references.attention``, input checks once,
then the autograd Function over the forward and backward kernels.

The checks are the contract's own (``references.attention.check_attention_inputs``) plus what the
kernels need: q, k, v of one dtype among fp32/bf16/fp16 (or fp8 e4m3/e5m2 with per-tensor descale
factors, forward only) on one device, head dims up to 256. Tokens are flattened to ``[B*T, H, D]``; a
batch without cu_seqlens is B sequences of T queries and S keys, so every kernel sees one layout
(``layout.Layout``).
"""
from __future__ import annotations

import math

import torch

from refcheck.references.attention import check_attention_inputs, check_softcap, check_window
from refcheck.references.contract import check_scale, check_shape, check_tensor

from ..common import check_flag, check_precision, check_runs_on
from .backward import backward
from .forward import SCHEDULES, forward, forward_kernel
from .layout import Layout, make_layout

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
MAX_HEAD_DIM = 256
DEFAULT_PRECISION = "tf32"
BLOCK_M = (128, 64)
"""Query rows per forward program: the knob's values, the default first."""


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """``[B, T, heads, D]`` as contiguous ``[B*T, heads, D]``."""
    return x.reshape(-1, *x.shape[2:]).contiguous()


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, lay: Layout, block_m: int, schedule: str):
        B, T, H, _ = q.shape
        q, k, v = (_tokens(x) for x in (q, k, v))
        o, lse = forward(q, k, v, lay, block_m, schedule=schedule, sinks=sinks)
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.lay = lay
        ctx.shape = (B, T, H)
        ctx.set_materialize_grads(False)
        return o.view(B, T, H, -1), lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        do = torch.zeros_like(o) if do is None else do.reshape(o.shape).contiguous()
        dq, dk, dv, delta = backward(q, k, v, o, lse, do, None if dlse is None else dlse.contiguous(), ctx.lay)
        # a sink is a key of value 0: its dS is P_sink (0 - delta), P_sink = exp(sinks[h] - lse) ([B, H, T], fp32),
        # 0 for a sink of -inf (whose row may see no key either: lse = -inf)
        dsinks = None
        if sinks is not None:
            sink = sinks.float().view(1, -1, 1)
            dsinks = -(torch.where(sink == -math.inf, 0.0, torch.exp(sink - lse)) * delta).sum((0, 2))
        B, T, H = ctx.shape
        return (dq.view(B, T, H, -1), dk.view(B, -1, *k.shape[1:]), dv.view(B, -1, *v.shape[1:]),
                None if dsinks is None else dsinks.to(sinks.dtype), None, None, None)


def _shape_only(x):
    """An fp8 tensor as a bf16 stand-in on the meta device (the contract's checks know no fp8)."""
    if isinstance(x, torch.Tensor) and x.dtype in FP8_DTYPES:
        return torch.empty(x.shape, dtype=torch.bfloat16, device="meta")
    return x


def _check_fp8(q, k, v, descales: dict) -> tuple[float, float, float] | None:
    """The descale factors ``(q, k, v)`` of fp8 inputs (each a positive number or a one-element
    tensor), or None for other inputs, which must come without them."""
    if q.dtype not in FP8_DTYPES:
        for name, d in descales.items():
            if d is not None:
                raise ValueError(f"{name}: only for fp8 inputs, got {q.dtype} q")
        return None
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.requires_grad:
            raise ValueError(f"{name}: fp8 attention is forward only, got a tensor that requires grad")
    values = []
    for name, d in descales.items():
        if d is None:
            raise ValueError(f"{name}: fp8 inputs need their per-tensor descale factor (value = stored * {name})")
        value = d.item() if isinstance(d, torch.Tensor) and d.numel() == 1 else d
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{name}: expected a positive finite number or one-element tensor, got {d!r}")
        values.append(float(value))
    return values[0], values[1], values[2]


def attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
              softcap=None, sinks=None, q_descale=None, k_descale=None, v_descale=None, precision=DEFAULT_PRECISION,
              block_m=BLOCK_M[0], schedule=SCHEDULES[0]):
    """Softmax attention (``references.attention``): ``(o [B, T, H, Dv] in q.dtype, lse fp32 [B, H, T])``.

    For each sequence, query head h and key head ``h // (H // Hk)``, with ``d_i = i + S - T`` query i's
    diagonal (aligned bottom-right) and ``s_ij = scale q_i . k_j`` (with ``softcap``: ``softcap tanh(s_ij /
    softcap)``, Gemma 2): ``o_i = sum_j softmax_j(s_ij) v_j`` over the keys j that query i sees: all, or
    causal ``j <= d_i``, or in the window ``window_size = (left, right)`` ``d_i - left <= j <= d_i + right``
    (a side None: unbounded; with causal the right side at most 0); ``lse_i = log sum_j exp(s_ij)``. With
    ``sinks [H]`` (gpt-oss) every row's softmax has one more key of score ``sinks[h]`` and value 0. A query
    that sees no key gets ``o_i = 0``, ``lse_i = -inf`` (with sinks: its sink). q ``[B, T, H, Dqk]``,
    k ``[B, S, Hk, Dqk]``, v ``[B, S, Hk, Dv]`` (Dqk, Dv <= 256, any, e.g. MLA's 192/128); packed: B = 1 with
    cu_seqlens_q / cu_seqlens_k ``[N+1]``. Differentiable in q, k, v and sinks (through o and lse); the
    backward is deterministic, and a window's kernels walk only the blocks inside it.

    fp8 (forward only): q, k, v all float8_e4m3fn or all float8_e5m2, holding ``x / x_descale``,
    with ``q_descale``, ``k_descale``, ``v_descale`` (positive, per tensor); o comes out in bf16.

    Knobs:
      precision: input precision of the fp32 ``tl.dot`` calls ("ieee", "tf32", "tf32x3"; fp32 inputs
                 only, bf16/fp16 dots are exact products with fp32 sums). Default "tf32" as kda's.
      block_m:   query rows per forward program (128 or 64; half as many where no launch of that many fits
                 the GPU's shared memory, e.g. fp32 at head dim 256 with "tf32x3").
      schedule:  the forward's programs: "grid", one per (query block, sequence, head) tile, or
                 "persistent", one per SM, each looping over tiles (longest causal blocks first).
    """
    check_attention_inputs(*(_shape_only(x) for x in (q, k, v)), cu_seqlens_q, cu_seqlens_k)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, 4, KERNEL_DTYPES + FP8_DTYPES)
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"{name}: expected {q.dtype} on {q.device} like q, got {x.dtype} on {x.device}")
    check_runs_on("q", q, forward_kernel)
    for name, d in (("q", q.shape[-1]), ("v", v.shape[-1])):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    scale = check_scale(scale, q.shape[-1])
    check_flag("causal", causal)
    if block_m not in BLOCK_M:
        raise ValueError(f"block_m: expected one of {BLOCK_M}, got {block_m!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    descale = _check_fp8(q, k, v, {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale})
    if sinks is not None:
        check_tensor("sinks", sinks, 1, KERNEL_DTYPES)
        check_shape("sinks", sinks, (q.shape[2],), "[H]")
        if sinks.device != q.device:
            raise ValueError(f"sinks: expected a tensor on {q.device} like q, got {sinks.device}")
        sinks = sinks.contiguous()
    lay = make_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=scale, causal=causal,
                      precision=check_precision(precision), window_size=check_window(window_size),
                      softcap=check_softcap(softcap))
    if descale is not None:
        if sinks is not None and sinks.requires_grad:
            raise ValueError("sinks: fp8 attention is forward only, got a tensor that requires grad")
        o, lse = forward(*(_tokens(x) for x in (q, k, v)), lay, block_m, descale, schedule=schedule, sinks=sinks)
        return o.view(*q.shape[:3], -1), lse
    return AttentionFunction.apply(q, k, v, sinks, lay, block_m, schedule)
