"""Public ``attention``: the contract signature of ``references.attention``, input checks once,
then the autograd Function over the forward and backward kernels.

The checks are the contract's own (``references.attention.check_attention_inputs``) plus what the
kernels need: q, k, v of one dtype among fp32/bf16/fp16 on one device, head dims up to 256. Tokens
are flattened to ``[B*T, H, D]``; a batch without cu_seqlens is B sequences of T queries and S keys,
so every kernel sees one layout (``layout.Layout``).
"""
from __future__ import annotations

import torch

from refcheck.references.attention import check_attention_inputs
from refcheck.references.contract import check_scale, check_tensor

from ..common import check_flag, check_precision
from .backward import backward
from .forward import forward
from .layout import Layout, make_layout

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
DEFAULT_PRECISION = "tf32"
BLOCK_M = (128, 64)
"""Query rows per forward program: the knob's values, the default first."""


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lay: Layout, block_m: int):
        B, T, H, _ = q.shape
        q, k, v = (x.reshape(-1, *x.shape[2:]).contiguous() for x in (q, k, v))
        o, lse = forward(q, k, v, lay, block_m)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.lay = lay
        ctx.shape = (B, T, H)
        ctx.set_materialize_grads(False)
        return o.view(B, T, H, -1), lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        do = torch.zeros_like(o) if do is None else do.reshape(o.shape).contiguous()
        dq, dk, dv = backward(q, k, v, o, lse, do, None if dlse is None else dlse.contiguous(), ctx.lay)
        B, T, H = ctx.shape
        return dq.view(B, T, H, -1), dk.view(B, -1, *k.shape[1:]), dv.view(B, -1, *v.shape[1:]), None, None


def attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
              precision=DEFAULT_PRECISION, block_m=BLOCK_M[0]):
    """Softmax attention (``references.attention``): ``(o [B, T, H, Dv] in q.dtype, lse fp32 [B, H, T])``.

    For each sequence, query head h and key head ``h // (H // Hk)``:
    ``o_i = sum_j softmax_j(scale q_i . k_j) v_j`` over the keys j that query i sees (all, or causal
    with the mask aligned bottom-right: ``j <= i + S - T``), ``lse_i = log sum_j exp(scale q_i . k_j)``;
    a query that sees no key gets ``o_i = 0``, ``lse_i = -inf``. q ``[B, T, H, Dqk]``, k ``[B, S, Hk, Dqk]``,
    v ``[B, S, Hk, Dv]`` (Dqk, Dv <= 256, any, e.g. MLA's 192/128); packed: B = 1 with
    cu_seqlens_q / cu_seqlens_k ``[N+1]``. Differentiable in q, k and v (through o and lse); the
    backward is deterministic.

    Knobs:
      precision: input precision of the fp32 ``tl.dot`` calls ("ieee", "tf32", "tf32x3"; fp32 inputs
                 only, bf16/fp16 dots are exact products with fp32 sums). Default "tf32" as kda's.
      block_m:   query rows per forward program (128 or 64).
    """
    check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, 4, KERNEL_DTYPES)
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"{name}: expected {q.dtype} on {q.device} like q, got {x.dtype} on {x.device}")
    for name, d in (("q", q.shape[-1]), ("v", v.shape[-1])):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    scale = check_scale(scale, q.shape[-1])
    check_flag("causal", causal)
    if block_m not in BLOCK_M:
        raise ValueError(f"block_m: expected one of {BLOCK_M}, got {block_m!r}")
    lay = make_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=scale, causal=causal,
                      precision=check_precision(precision))
    return AttentionFunction.apply(q, k, v, lay, block_m)
