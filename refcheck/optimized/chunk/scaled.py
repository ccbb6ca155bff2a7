"""Row-scaled fp16 storage of fp32 intermediates that only "tf32" dots read.

An fp32 array ``x [..., D]`` written by a program that holds blocks of ``SB`` columns is stored as

    X = x / s  (fp16, x's shape),    s [..., NSB]  (fp32, NSB = cdiv(D, SB)),

``s[r, b]`` the power of two at or above the largest magnitude of row r within column block b (a row of
the block lives in one warp of the producer's dot layout, so its maximum needs no barrier). A "tf32" dot
keeps 11 significant bits of an fp32 operand, fp16's; X's largest entry per row and block is in
``[1/2, 1]``, so a reader that multiplies ``X s`` back (exact: s is a power of two) and feeds a "tf32" dot
sees x rounded to nearest at 11 bits where the dot itself would truncate it to as many, and an entry far
below its row's largest keeps an absolute error under ``2^-24`` of it (fp16's subnormals), 2^-13 of what the
dot's rounding of that largest entry costs. Half the bytes of fp32: KDA's backward keeps its per-chunk
states h, their gradients dh, U and dY so (``kda.chunk_bwd``, whose gradient kernels' value blocks span several of
the writer's: ``load_tile_scaled_blocks``), and its forward's T (``kda.chunk_fwd.intra``, one scale a row: a row of
T holds its diagonal's 1, so its largest entry is at least 1).

``prepared`` stores the serial passes' K-side operands with the same row scales.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .tiles import load_rows, load_tile, row_offsets, tile_ptrs


def row_scaled(precision: str) -> bool:
    """Whether an intermediate that only dots at ``precision`` read may be stored row-scaled in fp16: under "tf32"
    (11 significant bits, fp16's)."""
    return precision == "tf32"


@triton.jit
def pow2_at_or_above(m):
    """The power of two at or above each ``m >= 0`` (fp32), from its bits with no floating-point operation: 2^-126
    for a subnormal m, 1 for m = 0. ``exp2(ceil(log2(m)))`` was 0 on the GPU for a subnormal m (a row of
    ``k e^G`` decayed below 2^-126; the GPU's exp2 flushes a subnormal result, see ``runtime.interpreter``), so
    x / s was not finite (strong decay, bf16, H200)."""
    p = (m.to(tl.int32, bitcast=True) + 0x007FFFFF) & 0x7F800000
    return tl.where(p == 0, 1.0, p.to(tl.float32, bitcast=True))


@triton.jit
def pow2_reciprocal(s):
    """``1 / s`` of powers of two ``s`` in ``[2^-126, 2^127]`` (fp32), exactly, from their bits: the exponent
    negated, ``2^-127`` (a subnormal) for ``s = 2^127``."""
    r = 0x7F000000 - s.to(tl.int32, bitcast=True)
    return tl.where(r == 0, 0x00400000, r).to(tl.float32, bitcast=True)


@triton.jit
def scale_rows(x):
    """``(x / s[:, None], s)``: each row of ``x [R, D]`` over the power of two at or above its largest magnitude,
    as ``x`` times ``1 / s`` (exact, and one multiplication an entry where a division took three)."""
    s = pow2_at_or_above(tl.max(tl.abs(x), axis=1))
    return x * pow2_reciprocal(s)[:, None], s


@triton.jit
def store_scaled(p, mask, s_p, s_mask, x, SCALED: tl.constexpr):
    """Store ``x [R, SB]`` (one column block) at pointers p: with ``SCALED`` as ``x / s`` in p's dtype and its row
    scales s at s_p ``[R]``; else x in p's dtype."""
    if SCALED:
        X, s = scale_rows(x)
        tl.store(p, X.to(p.dtype.element_ty), mask=mask)
        tl.store(s_p, s, mask=s_mask)
    else:
        tl.store(p, x.to(p.dtype.element_ty), mask=mask)


@triton.jit
def scaled_back(x, s_row, rmask, c0, SB, SCALED: tl.constexpr):
    """A loaded fp32 tile x, columns from c0 on: with ``SCALED`` times its row scales (``s_row [R]`` pointing to each
    row's first; the tile lies within one block of SB columns, so one scale a row, a vector load; zero where
    ``rmask`` is not), else x."""
    if SCALED:
        x *= tl.load(s_row + c0 // SB, mask=rmask, other=0.0)[:, None]
    return x


@triton.jit
def store_tile_scaled(ptr, s_ptr, x, rows, rmask, h, H, D, cols, cmask, SCALED: tl.constexpr):
    """``store_tile`` of one column block of a ``[T, H, D]`` array, with ``SCALED`` row-scaled: the scales
    ``[T, H, NSB]`` at s_ptr, the block being the program's axis 0 (a serial kernel's value block)."""
    s_p = s_ptr + row_offsets(rows, h, H, tl.num_programs(0)) + tl.program_id(0)
    store_scaled(tile_ptrs(ptr, rows, h, H, D, cols), rmask[:, None] & cmask[None, :], s_p, rmask, x, SCALED)


@triton.jit
def load_rows_scaled(x, s_ptr, t0, rows, rmask, h, H, D, c0, BD: tl.constexpr, SB, NSB, SCALED: tl.constexpr,
                     TMA: tl.constexpr):
    """``scaled_back`` of the tile ``x[rows, h, c0 : c0 + BD]`` of a ``[T, H, D]`` array, its scales ``[T, H, NSB]``,
    through ``tiles.load_rows`` (x a pointer, or with ``TMA`` a descriptor): the rows past a sequence's end, whatever
    they loaded, are zero where ``SCALED`` (their scales load as zeros)."""
    return scaled_back(load_rows(x, t0, rows, rmask, h, H, D, c0, BD, TMA), s_ptr + row_offsets(rows, h, H, NSB),
                       rmask, c0, SB, SCALED)


@triton.jit
def load_tile_scaled_blocks(ptr, s_ptr, rows, rmask, h, H, D, c0, cmask, SB: tl.constexpr, NSB, BD: tl.constexpr):
    """fp32 tile ``x[rows, h, c0 : c0 + BD]`` (columns masked by cmask) of a row-scaled ``[T, H, D]`` array (scales
    ``[T, H, NSB]``) whose BD columns may span several of the writer's blocks of SB (where ``load_rows_scaled``
    takes one scale a row): the tile seen as ``[R, NB, BD / NB]`` times its ``[R, NB]`` scales."""
    NB: tl.constexpr = BD // SB if BD > SB else 1
    x = load_tile(ptr, rows, rmask, h, H, D, c0 + tl.arange(0, BD), cmask)
    b = c0 // SB + tl.arange(0, NB)
    s = tl.load(tile_ptrs(s_ptr, rows, h, H, NSB, b), mask=rmask[:, None] & (b < NSB)[None, :], other=0.0)
    R: tl.constexpr = x.shape[0]
    return tl.reshape(tl.reshape(x, (R, NB, BD // NB)) * s[:, :, None], (R, BD))


class Stored(NamedTuple):
    """An intermediate as a kernel wrote it: ``data`` (fp16 where ``scales`` is given, else its own dtype), the row
    scales (fp32 ``[*data.shape[:-1], NSB]`` or None) and the width SB of their column blocks."""

    data: torch.Tensor
    scales: torch.Tensor | None = None
    block: int = 1

    @property
    def scaled(self) -> bool:
        return self.scales is not None

    @property
    def blocks(self) -> int:
        """The scales' column blocks per row, ``NSB`` (1 unscaled)."""
        return 1 if self.scales is None else self.scales.shape[-1]

    def scale_ptr(self) -> torch.Tensor:
        """The scales, or (unscaled) the data as a pointer no kernel reads."""
        return self.data if self.scales is None else self.scales

    def float(self) -> torch.Tensor:
        """The fp32 values ``X s`` (tests, diagnostics)."""
        if self.scales is None:
            return self.data.float()
        s = self.scales.repeat_interleave(self.block, dim=-1)[..., :self.data.shape[-1]]
        return self.data.float() * s


def allocate(shape: tuple, block: int, scaled: bool, dtype: torch.dtype, device) -> Stored:
    """An empty ``Stored`` of ``shape``: fp16 with row scales per block of ``block`` columns where ``scaled``, else
    ``dtype``."""
    if not scaled:
        return Stored(torch.empty(shape, device=device, dtype=dtype))
    return Stored(torch.empty(shape, device=device, dtype=torch.float16),
                  torch.empty(*shape[:-1], triton.cdiv(shape[-1], block), device=device, dtype=torch.float32), block)
