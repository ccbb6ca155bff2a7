"""Tile loads and stores shared by the KDA kernels. Tensors are token-major ``[T, H, D]`` (tokens of
all sequences flattened); a tile is ``x[rows, h, cols]``."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, rows, rmask, h, H, D, cols, cmask):
    """fp32 tile ``x[rows, h, cols]``, zero where masked."""
    off = (rows.to(tl.int64)[:, None] * H + h) * D + cols[None, :]
    return tl.load(ptr + off, mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def store_tile(ptr, x, rows, rmask, h, H, D, cols, cmask):
    """Store ``x`` into ``ptr[rows, h, cols]`` in the pointer's dtype."""
    off = (rows.to(tl.int64)[:, None] * H + h) * D + cols[None, :]
    tl.store(ptr + off, x.to(ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def load_rowvec(ptr, rows, rmask, h, H):
    """fp32 ``x[rows, h]`` of a ``[T, H]`` tensor (beta)."""
    return tl.load(ptr + rows.to(tl.int64) * H + h, mask=rmask, other=0.0).to(tl.float32)


@triton.jit
def chunk_span(c, cu_ptr, seq_ptr, start_ptr, C: tl.constexpr):
    """First token and number of valid rows (<= C) of chunk c."""
    t0 = tl.load(start_ptr + c)
    eos = tl.load(cu_ptr + tl.load(seq_ptr + c) + 1)
    return t0, tl.minimum(eos - t0, C)
