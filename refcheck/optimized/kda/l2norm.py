"""Row-wise L2 normalization for ``use_qk_l2norm``: ``y = x * r`` with ``r = (sum_d x_d^2 + eps)^{-1/2}``.

The forward normalizes q and k where it forms their operands (``front``, through ``inverse_norm``) and keeps
nothing else. Backward: ``dx = r (dy - y <y, dy>)``, r and y recomputed from x in fp32; rows are the last dimension
of a contiguous tensor.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import padded

EPS = 1e-6  # as references.kda.L2NORM_EPS


@triton.jit
def inverse_norm(sum_squares, eps):
    """``r = (sum_d x_d^2 + eps)^{-1/2}`` of each row's sum of squares."""
    return 1 / tl.sqrt(sum_squares + eps)


@triton.jit
def l2norm_backward_kernel(x_ptr, dy_ptr, dx_ptr, rows, D, eps, R: tl.constexpr, BD: tl.constexpr):
    """R rows: ``dx`` from x and the gradient dy of y."""
    r = tl.program_id(0) * R + tl.arange(0, R)
    d = tl.arange(0, BD)
    mask = (r < rows)[:, None] & (d < D)[None, :]
    off = r.to(tl.int64)[:, None] * D + d[None, :]
    x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
    rstd = inverse_norm(tl.sum(x * x, axis=1), eps)
    y = x * rstd[:, None]
    dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
    dx = rstd[:, None] * (dy - y * tl.sum(y * dy, axis=1)[:, None])
    tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def l2norm_backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx in x's dtype, from the gradient dy of y (any float dtype)."""
    D = x.shape[-1]
    rows = x.numel() // D if D else 0
    bd = padded(D)
    per = max(1, min(64, 4096 // bd))
    dx = torch.empty_like(x)
    if rows:
        l2norm_backward_kernel[(triton.cdiv(rows, per),)](x, dy, dx, rows, D, EPS, R=per, BD=bd)
    return dx
