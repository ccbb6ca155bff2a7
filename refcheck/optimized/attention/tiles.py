"""Tile loads, stores and the visibility mask shared by the attention kernels.

Tensors are token-major ``[tokens, heads, D]`` (the tokens of every sequence flattened, contiguous);
a tile is ``x[rows, head, cols]``. A sequence is the query span ``[qs, qs + Tq)`` and the key span
``[ks, ks + Sk)`` of the flattened axes; inside it queries i and keys j are local indices.
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
"""log2(e): the kernels work in base 2, ``exp(x) = exp2(x * LOG2E)``."""
KERNEL_LOG2E = tl.constexpr(LOG2E)
"""The same inside kernels (compiled, a kernel reads only constexpr globals)."""


@triton.jit
def load_tile(ptr, rows, rmask, head, heads, D, cols, cmask):
    """``x[rows, head, cols]`` in the tensor's dtype (the operand of ``tl.dot``), zero where masked."""
    off = (rows.to(tl.int64)[:, None] * heads + head) * D + cols[None, :]
    return tl.load(ptr + off, mask=rmask[:, None] & cmask[None, :], other=0.0)


@triton.jit
def store_tile(ptr, x, rows, rmask, head, heads, D, cols, cmask):
    """Store ``x`` into ``ptr[rows, head, cols]`` in the pointer's dtype."""
    off = (rows.to(tl.int64)[:, None] * heads + head) * D + cols[None, :]
    tl.store(ptr + off, x.to(ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def sequence(n, cuq_ptr, cuk_ptr):
    """``(qs, Tq, ks, Sk)``: where sequence n's queries and keys start and how many there are."""
    qs = tl.load(cuq_ptr + n)
    ks = tl.load(cuk_ptr + n)
    return qs, tl.load(cuq_ptr + n + 1) - qs, ks, tl.load(cuk_ptr + n + 1) - ks


@triton.jit
def row_offset(n, h, H, T, qs, BATCHED: tl.constexpr):
    """Offset of query token ``qs`` (flattened) in a ``[B, H, T]`` row tensor (lse, delta): batched,
    sequence n is batch row n; packed, everything is batch row 0."""
    if BATCHED:
        return (n * H + h).to(tl.int64) * T + qs - n * T
    return h.to(tl.int64) * T + qs


@triton.jit
def visible(i, j, Tq, Sk, CAUSAL: tl.constexpr):
    """Whether query i sees key j (broadcast shapes): both exist and, causal, ``j <= i + Sk - Tq``
    (the mask aligned bottom-right: the last query sees every key)."""
    ok = (i < Tq) & (j < Sk)
    if CAUSAL:
        ok = ok & (j <= i + (Sk - Tq))
    return ok


@triton.jit
def causal_key_end(m0, BM: tl.constexpr, Tq, Sk, CAUSAL: tl.constexpr):
    """One past the last key any of queries ``m0 .. m0 + BM - 1`` sees (causal) or ``Sk``."""
    if CAUSAL:
        return tl.maximum(tl.minimum(m0 + BM + Sk - Tq, Sk), 0)
    return Sk
