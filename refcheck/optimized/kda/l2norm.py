"""Row-wise L2 normalization for ``use_qk_l2norm``: ``y = x * r`` with ``r = (sum_d x_d^2 + eps)^{-1/2}``.

Backward: ``dx = r (dy - y <y, dy>)``. Rows are the last dimension of a contiguous tensor; the
forward writes y in x's dtype (what the chunk kernels then read) and keeps nothing else, the
backward recomputes r and y from x in fp32.
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
def l2norm_kernel(x_ptr, dy_ptr, out_ptr, rows, D, eps, R: tl.constexpr, BD: tl.constexpr, BACKWARD: tl.constexpr):
    """R rows: ``out = y`` (forward) or ``out = dx`` (backward, from dy)."""
    r = tl.program_id(0) * R + tl.arange(0, R)
    d = tl.arange(0, BD)
    mask = (r < rows)[:, None] & (d < D)[None, :]
    off = r.to(tl.int64)[:, None] * D + d[None, :]
    x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
    rstd = inverse_norm(tl.sum(x * x, axis=1), eps)
    y = x * rstd[:, None]
    if BACKWARD:
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        out = rstd[:, None] * (dy - y * tl.sum(y * dy, axis=1)[:, None])
    else:
        out = y
    tl.store(out_ptr + off, out.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, dy: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    D = x.shape[-1]
    rows = x.numel() // D if D else 0
    bd = padded(D)
    per = max(1, min(64, 4096 // bd))
    if rows:
        l2norm_kernel[(triton.cdiv(rows, per),)](x, dy if dy is not None else x, out, rows, D, EPS, R=per, BD=bd,
                                                 BACKWARD=dy is not None)
    return out


def l2norm_forward(x: torch.Tensor) -> torch.Tensor:
    """y in x's dtype."""
    return _launch(x, None, torch.empty_like(x))


def l2norm_backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx in x's dtype, from the gradient dy of y (any float dtype)."""
    return _launch(x, dy, torch.empty_like(x))
