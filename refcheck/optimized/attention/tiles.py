"""Tile loads, stores and the visibility mask shared by the attention kernels.

Tensors are token-major ``[tokens, heads, D]`` (the tokens of every sequence flattened, contiguous);
a tile is ``x[rows, head, cols]``. A sequence is the query span ``[qs, qs + Tq)`` and the key span
``[ks, ks + Sk)`` of the flattened axes; inside it queries i and keys j are local indices.

The blocks a kernel walks (keys in the forward and ``dq_kernel``, queries in ``dkdv_kernel``) load
through TMA descriptors (``block_descriptors``, constexpr ``TMA``) wherever the tensors allow one
(``common.tma_aligned``), else through pointers. A TMA block past a sequence's end holds the next sequence's
rows (zeros past the tensor) where pointer loads read zeros; every kernel masks those rows to
``p = 0`` and ``dS = 0`` before they reach a sum, so both give the same bits (``tests/test_optimized_attention.py``).
On an H200 (bf16, ``benchmarks/attention_sweep.py``) TMA made the forward 5-21% faster.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..common import row_blocks


@triton.jit
def tile_offsets(row0, head, heads, D: tl.constexpr, C0: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """``(base, off)`` addressing ``x[row0 + r, head, C0 + c]``, ``r < BR``, ``c < BD``: an int64 scalar
    (token ``row0``, the head, column C0) and the int32 offsets ``r * heads * D + c`` ``[BR, BD]`` from it."""
    base = (row0.to(tl.int64) * heads + head) * D + C0
    return base, tl.arange(0, BR)[:, None] * (heads * D) + tl.arange(0, BD)[None, :]


@triton.jit
def tile_mask(nrows, D: tl.constexpr, C0: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
              MASK_ROWS: tl.constexpr):
    """Which elements of a ``tile_offsets`` tile exist: rows ``r < nrows`` (MASK_ROWS) and columns
    ``C0 + c < D`` (where the tile reaches past D), broadcast; call only if one of the two applies."""
    c = tl.arange(0, BD)[None, :]
    if MASK_ROWS:
        mask = tl.arange(0, BR)[:, None] < nrows
        if C0 + BD > D:
            mask = mask & (c < D - C0)
    else:
        mask = c < D - C0
    return mask


@triton.jit
def load_tile(ptr, row0, nrows, head, heads, D: tl.constexpr, C0: tl.constexpr, BR: tl.constexpr,
              BD: tl.constexpr, MASK_ROWS: tl.constexpr = True):
    """``x[row0 + r, head, C0 + c]`` ``[BR, BD]`` in the tensor's dtype (the operand of ``tl.dot``), zero
    where ``r >= nrows`` (checked only when MASK_ROWS) or ``C0 + c >= D``; a tile known to be in
    bounds loads without a mask."""
    base, off = tile_offsets(row0, head, heads, D, C0, BR, BD)
    if MASK_ROWS or C0 + BD > D:
        x = tl.load(ptr + base + off, mask=tile_mask(nrows, D, C0, BR, BD, MASK_ROWS), other=0.0)
    else:
        x = tl.load(ptr + base + off)
    return x


@triton.jit
def store_tile(ptr, x, row0, nrows, head, heads, D: tl.constexpr, C0: tl.constexpr, BR: tl.constexpr,
               BD: tl.constexpr):
    """Store ``x [BR, BD]`` into ``ptr[row0 + r, head, C0 + c]`` (``r < nrows``, ``C0 + c < D``) in the
    pointer's dtype."""
    base, off = tile_offsets(row0, head, heads, D, C0, BR, BD)
    tl.store(ptr + base + off, x.to(ptr.dtype.element_ty), mask=tile_mask(nrows, D, C0, BR, BD, True))


@triton.jit
def load_split(ptr, row0, nrows, head, heads, D: tl.constexpr, BR: tl.constexpr, B1: tl.constexpr,
               B2: tl.constexpr, MASK_ROWS: tl.constexpr = True):
    """``(x1, x2)``: the column tiles ``x[rows, head, 0:B1]`` and ``x[rows, head, B1:B1 + B2]`` of a q or
    k block (``load_tile``); with B2 = 0 there is one tile and x2 is x1 again (never used)."""
    x1 = load_tile(ptr, row0, nrows, head, heads, D, 0, BR, B1, MASK_ROWS)
    x2 = x1
    if B2 > 0:
        x2 = load_tile(ptr, row0, nrows, head, heads, D, B1, BR, B2, MASK_ROWS)
    return x1, x2


@triton.jit
def load_block(ptr, desc1, desc2, row0, nrows, head, heads, D: tl.constexpr, BR: tl.constexpr, B1: tl.constexpr,
               B2: tl.constexpr, MASK_ROWS: tl.constexpr, TMA: tl.constexpr):
    """``(x1, x2)`` of ``load_split``, or with TMA through ``desc1``, ``desc2`` (``block_descriptors``): rows
    past ``nrows`` then hold what follows in the tensor, for the caller to mask."""
    if TMA:
        x1 = desc1.load([row0, head, 0]).reshape(BR, B1)
        x2 = x1
        if B2 > 0:
            x2 = desc2.load([row0, head, B1]).reshape(BR, B2)
    else:
        x1, x2 = load_split(ptr, row0, nrows, head, heads, D, BR, B1, B2, MASK_ROWS)
    return x1, x2


@triton.jit
def zeros_split(BR: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr):
    """``(x1, x2)``: fp32 zero accumulators ``[BR, B1]`` and ``[BR, B2]`` for the two column tiles of
    ``load_split``; with B2 = 0, x2 is x1 again (never used)."""
    x1 = tl.zeros((BR, B1), tl.float32)
    x2 = x1
    if B2 > 0:
        x2 = tl.zeros((BR, B2), tl.float32)
    return x1, x2


@triton.jit
def dot_split(a1, a2, b1, b2, B2: tl.constexpr, PREC: tl.constexpr):
    """``a b^T`` of two row blocks split by columns as ``load_split`` does: ``a1 b1^T + a2 b2^T`` (one
    accumulator), or ``a1 b1^T`` when B2 = 0."""
    s = tl.dot(a1, tl.trans(b1), input_precision=PREC)
    if B2 > 0:
        s = tl.dot(a2, tl.trans(b2), s, input_precision=PREC)
    return s


@triton.jit
def query_block(BM: tl.constexpr, RIGHT: tl.constexpr):
    """The first query row of this program's block ``program_id(0)`` of BM rows (``block_row``)."""
    return block_row(tl.program_id(0), tl.num_programs(0), BM, RIGHT)


@triton.jit
def block_row(b, NB, BM: tl.constexpr, RIGHT: tl.constexpr):
    """The first query row of the ``b``-th of ``NB`` blocks of BM rows in launch order. Bounded on the right
    (causal), the blocks run last first: later queries see more keys, so the longest programs start first and
    the short ones fill the tail of the launch (a query block past a sequence's end does nothing either way)."""
    if RIGHT:
        b = NB - 1 - b
    return b * BM


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
def visible(i, j, Tq, Sk, left, right, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """Whether query i sees key j (broadcast shapes): both exist and j lies in i's window around its diagonal
    ``d = i + Sk - Tq`` (aligned bottom-right: the last query's diagonal is the last key): ``j >= d - left``
    where LEFT (a window's left side), ``j <= d + right`` where RIGHT (causal: right = 0)."""
    ok = (i < Tq) & (j < Sk)
    if LEFT:
        ok = ok & (j >= i + (Sk - Tq) - left)
    if RIGHT:
        ok = ok & (j <= i + (Sk - Tq) + right)
    return ok


@triton.jit
def softcapped(s, cap_in, cap_out, SOFTCAP: tl.constexpr):
    """``(scores, dfactor)`` of a ``q k^T`` block ``s`` (unscaled): with SOFTCAP the base-2 scores
    ``cap_out t``, ``t = tanh(cap_in s)`` (``cap_in = scale / softcap``, ``cap_out = softcap log2(e)``), and
    ``1 - t^2``, the factor that takes the gradient of a score to that of ``scale q k^T``; else s itself (the
    kernels scale it by ``qk_scale`` inside their max and exp2: one FMA an element) and s again (never used)."""
    dfactor = s
    if SOFTCAP:
        t = libdevice.tanh(s * cap_in)
        s = t * cap_out
        dfactor = 1.0 - t * t
    return s, dfactor


@triton.jit
def key_blocks(m0, BM: tl.constexpr, BN: tl.constexpr, Tq, Sk, left, right, LEFT: tl.constexpr,
               RIGHT: tl.constexpr):
    """``(start, lo, hi, end)``: the key blocks ``[j0, j0 + BN)`` that queries ``m0 .. m0 + BM - 1`` walk. Some
    query sees a key of every block from ``start`` (a multiple of BN) up to ``end``; the blocks from ``lo`` up
    to ``hi`` (multiples of BN; none where ``hi <= lo``) exist and are seen whole by every query of the block,
    so they need no mask. A walk takes ``[start, min(lo, end))`` masked, ``[lo, hi)`` unmasked, then
    ``[max(lo, hi), end)`` masked. Unbounded on the left, ``start = lo = 0``; a window skips the blocks it
    excludes."""
    d = m0 + Sk - Tq                                      # the first query's diagonal
    start = 0
    lo = 0
    if LEFT:
        start = tl.maximum(d - left, 0) // BN * BN
        lo = (tl.maximum(d + BM - 1 - left, 0) + BN - 1) // BN * BN
    end = Sk
    hi = Sk
    if RIGHT:
        end = tl.maximum(tl.minimum(d + BM + right, Sk), 0)
        hi = tl.maximum(tl.minimum(d + 1 + right, Sk), 0)
    return start, lo, hi // BN * BN, end


@triton.jit
def query_blocks(n0, BN: tl.constexpr, BM: tl.constexpr, Tq, Sk, left, right, LEFT: tl.constexpr,
                 RIGHT: tl.constexpr):
    """``(first, a, b, last)``: the query blocks ``[m0, m0 + BM)`` that see some key of ``n0 .. n0 + BN - 1``
    (query i sees key j where ``j - right <= i + Sk - Tq <= j + left``), the transpose of ``key_blocks``: from
    ``first`` (a multiple of BM) up to ``last``, those from ``a`` up to ``b`` (multiples of BM) whole and seeing
    every key of the block, unmasked; a walk takes ``[first, a)`` masked, ``[a, b)`` unmasked, ``[b, last)``
    masked. A partial key block (keys past Sk) is masked throughout."""
    off = Sk - Tq
    first = 0
    mid = 0
    if RIGHT:        # key n0 from `first` on, key n0 + BN - 1 from `mid` on
        first = tl.maximum(n0 - off - right, 0) // BM * BM
        mid = (tl.maximum(n0 + BN - 1 - off - right, 0) + BM - 1) // BM * BM
    last = Tq
    whole = Tq // BM * BM
    if LEFT:         # key n0 + BN - 1 up to query `last`, key n0 up to query `whole`
        last = tl.maximum(tl.minimum(n0 + BN + left - off, Tq), 0)
        whole = tl.minimum(whole, tl.maximum(n0 + 1 + left - off, 0) // BM * BM)
    some = (whole > mid) & (n0 + BN <= Sk)
    a = tl.where(some, mid, first)
    b = tl.where(some, whole, first)
    return first, a, b, last


def block_descriptors(x: torch.Tensor, y: torch.Tensor, rows: int, x_tiles: tuple[int, int], y_width: int,
                      tma: bool) -> tuple:
    """``(x1, x2, y1)``: TMA descriptors of blocks of ``rows`` tokens of one head of x and y ``[tokens, heads, D]``
    (k and v, or q and dO), for x's column tiles ``x_tiles = (B1, B2)`` of ``load_block`` (B2 = 0: the first
    again) and y's one tile ``y_width``; what lies past a tensor loads as zeros. Without ``tma``: ``(x, x, y)``,
    which a kernel launched with ``TMA=False`` takes and ignores."""
    if not tma:
        return x, x, y

    x1 = row_blocks(x, rows, x_tiles[0])
    return x1, row_blocks(x, rows, x_tiles[1]) if x_tiles[1] else x1, row_blocks(y, rows, y_width)
