"""Tile loads and stores shared by the chunked linear-attention kernels (KDA, GLA, simple GLA).

Token tensors hold, for every token (tokens of all sequences flattened, ``row`` in ``[0, B*T)``) and
head h, a vector of D channels. Two layouts are read without copies:

* sequence-first (the contract, the default): ``[B, T, H, D]``, element ``(row * H + h) * D + col``;
* head-first (``HEAD_FIRST``): ``[B, H, T, D]``, element ``((b * H + h) * T + t) * D + col`` with
  ``b = row // T``, ``t = row % T``.

Within one sequence consecutive rows are ``row_stride`` elements apart in either layout. Intermediates
(cumulative gates, chunk matrices) are always sequence-first. A tile is ``x[rows, h, cols]``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MIN_BLOCK = 32
"""The narrowest channel or value block of the 8-warp kernels and of the serial kernels' state blocks
(``padded(n, MIN_BLOCK)``) of GLA and of the chunk output (``chunk.output``). On an H100 (Triton 3.6),
K = 16 with blocks of 16 at 8 warps and precision "tf32x3" made ``output_kernel``'s o wrong by up to 0.56
(fp32, bf16 and fp16 inputs) and ``grads_qk_kernel`` lose the CUDA context
(an illegal memory access); with blocks of 32 both are right
(``benchmarks/results/gpu_gla_k16_h100.txt``). The interpreter computes both right: the compiled code is at
fault, found by ``refcheck report`` on the GPU. A GPU law run (H100, before 69409fe) lost the CUDA context at K = 13
("Invalid __shared__ read" in an 8-warp kernel), most likely in a variant of the serial state pass at 8 warps
with state blocks of 16 (since dropped); whether the 4-warp serial kernels share the fault is untested, so
their blocks are 32 wide too."""


def cumulative_gate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the chunk-local cumulative gate ``G`` for inputs of ``dtype``: fp64 for fp32 inputs,
    fp32 otherwise. Every decay is ``exp(G_i - G_j)`` of two cumulative sums; in fp32 each sum carries
    the rounding of its magnitude, so under strong decay (log-decays of -1000 in a chunk of 128 give
    ``|G| ~ 1.7e4``, one fp32 ulp 2e-3) the difference of two nearby rows loses all its digits, where the
    fp32 budgets ask for the recurrence's accuracy. In fp64 the difference is taken exactly enough and
    only then rounded (``chunk.tiles.decay``): on log-decays of -1000 at 30% of the steps, o's error
    against float64 went 3.5e-4 -> 1.3e-7 at chunk size 128 (interpreted, ``tests/test_optimized_gla.py``);
    KDA's, on log-decays of -1000 at half the steps, 1.7e-4 -> 8.2e-8 at T=150 (``tests/test_optimized_kda.py``;
    an H200 law run found it at T=6).
    For 16-bit inputs fp32 stays (their budgets are three orders looser, and fp64 tiles would double the
    gate's registers and traffic in the kernels timed against FLA)."""
    return torch.float64 if dtype == torch.float32 else torch.float32


@triton.jit
def row_offsets(rows, h, H, D, T=1, HEAD_FIRST: tl.constexpr = False):
    """int64 offset of ``x[row, h, 0]`` for every row of ``rows`` (see the module docstring)."""
    r = rows.to(tl.int64)
    if HEAD_FIRST:
        off = ((r // T) * H + h) * T * D + (r % T) * D
    else:
        off = (r * H + h) * D
    return off


def row_stride(H: int, D: int, head_first: bool) -> int:
    """Elements between consecutive tokens of one sequence and head."""
    return D if head_first else H * D


@triton.jit
def tile_ptrs(ptr, rows, h, H, D, cols, T=1, HEAD_FIRST: tl.constexpr = False):
    """Pointers of ``x[rows, h, cols]`` for rows of one sequence: the int64 offset of the lowest row
    ``r0`` once, as a scalar base, and int32 offsets ``(rows - r0) row_stride + cols`` from it (int64
    offsets per element cost registers that the tiles need)."""
    r0 = tl.min(rows, axis=0)
    stride = D if HEAD_FIRST else H * D
    return ptr + row_offsets(r0, h, H, D, T, HEAD_FIRST) + ((rows - r0) * stride)[:, None] + cols[None, :]


@triton.jit
def load_tile(ptr, rows, rmask, h, H, D, cols, cmask, T=1, HEAD_FIRST: tl.constexpr = False):
    """fp32 tile ``x[rows, h, cols]`` (rows of one sequence), zero where masked."""
    p = tile_ptrs(ptr, rows, h, H, D, cols, T, HEAD_FIRST)
    return tl.load(p, mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def load_operand(ptr, rows, rmask, h, H, D, cols, cmask, T=1, HEAD_FIRST: tl.constexpr = False):
    """``x[rows, h, cols]`` in the tensor's own dtype, zero where masked: a dot operand taken as it is
    stored. A bf16 or fp16 tile feeds the tensor cores directly, its products exact as those of its
    fp32 conversion under "tf32" (10 mantissa bits hold 8 or 11 exactly), at twice the rate and half
    the shared memory; an fp32 tile is used under the dot's ``input_precision``."""
    return tl.load(tile_ptrs(ptr, rows, h, H, D, cols, T, HEAD_FIRST), mask=rmask[:, None] & cmask[None, :], other=0.0)


@triton.jit
def load_rows_stored(x, t0, rows, rmask, h, H, D, c0, BD: tl.constexpr, TMA: tl.constexpr):
    """The tile ``x[rows, h, c0 : c0 + BD]`` of a sequence-first ``[T, H, D]`` tensor in its own dtype, ``rows`` from
    ``t0`` on: through pointers (zero where masked), or with ``TMA`` through x as a descriptor (``common.tma_operands``,
    blocks ``[len(rows), 1, BD]``). Rows past the sequence's end then hold the next sequence's (zeros past the
    tensor), which the caller must weigh by zero or keep out of every stored row (the serial passes: a prepared
    operand's rows by their row scales, which load as zeros there, and beta's zeros)."""
    if TMA:
        out = x.load([t0, h, c0]).reshape(rows.shape[0], BD)
    else:
        cols = c0 + tl.arange(0, BD)
        out = load_operand(x, rows, rmask, h, H, D, cols, cols < D)
    return out


@triton.jit
def load_rows(x, t0, rows, rmask, h, H, D, c0, BD: tl.constexpr, TMA: tl.constexpr):
    """``load_rows_stored`` in fp32."""
    return load_rows_stored(x, t0, rows, rmask, h, H, D, c0, BD, TMA).to(tl.float32)


@triton.jit
def store_tile(ptr, x, rows, rmask, h, H, D, cols, cmask, T=1, HEAD_FIRST: tl.constexpr = False):
    """Store ``x`` into ``ptr[rows, h, cols]`` (rows of one sequence) in the pointer's dtype."""
    p = tile_ptrs(ptr, rows, h, H, D, cols, T, HEAD_FIRST)
    tl.store(p, x.to(ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def load_rowvec(ptr, rows, rmask, h, H, T=1, HEAD_FIRST: tl.constexpr = False):
    """fp32 ``x[rows, h]`` of a ``[T, H]`` tensor (beta, a scalar gate)."""
    return tl.load(ptr + row_offsets(rows, h, H, 1, T, HEAD_FIRST), mask=rmask, other=0.0).to(tl.float32)


@triton.jit
def load_gate(G_ptr, rows, rmask, h, H, K, cols, cmask, SCALAR: tl.constexpr = False):
    """``[R, BK]`` tile of a sequence-first cumulative gate in its stored dtype (fp32, or fp64 where the
    differences must stay exact, ``cumulative_gate_dtype``): ``G[rows, h, cols]`` of a
    ``[T, H, K]`` gate, or with ``SCALAR`` the ``[T, H]`` gate ``G[rows, h]`` broadcast over the columns.
    Exponents are differences of these tiles, taken in that dtype (``decay``)."""
    if SCALAR:
        g = tl.load(G_ptr + row_offsets(rows, h, H, 1), mask=rmask, other=0.0)
        g = g[:, None] + tl.zeros_like(cols).to(g.dtype)[None, :]
    else:
        g = tl.load(tile_ptrs(G_ptr, rows, h, H, K, cols), mask=rmask[:, None] & cmask[None, :], other=0.0)
    return g


@triton.jit
def load_gate_row(G_ptr, row, h, H, K, cols, cmask, SCALAR: tl.constexpr = False):
    """``[BK]`` row ``G[row, h, cols]`` of a cumulative gate in its stored dtype (``SCALAR``: ``G[row, h]``
    broadcast)."""
    if SCALAR:
        g = tl.load(G_ptr + row.to(tl.int64) * H + h)
        g = g + tl.zeros_like(cols).to(g.dtype)
    else:
        g = tl.load(G_ptr + (row.to(tl.int64) * H + h) * K + cols, mask=cmask, other=0.0)
    return g


@triton.jit
def decay(x):
    """``exp(x)`` in fp32 of an exponent formed from cumulative gates (a difference ``G_i - G_j`` or a
    ``G_i``), taken in the gates' dtype before the exponential: with fp64 gates the difference of two
    large cumulative sums keeps its fp32 accuracy."""
    return tl.exp(x.to(tl.float32))


@triton.jit
def tf32_nearest(x, PREC: tl.constexpr):
    """Under ``PREC`` "tf32", fp32 x rounded to nearest at tf32's 11 significant bits (ties away from zero), from its
    bits as ``cvt.rna.tf32.f32`` does (Inf and NaN kept: a NaN's payload carried past its mantissa would make it a
    zero): a "tf32" dot on Hopper truncates its fp32 operands to them, so that one fed x takes it as rounded; else x.
    Measured (H200, KDA's forward with its output in the serial pass, fp32 inputs, B=2, T=1024, H=16, K=V=128): o's
    error against float64 1.78e-3 with P and U truncated by the dot, 9.3e-4 rounded first (1.17e-3 where a kernel of
    its own took U row-scaled in fp16; at c4e3a2a)."""
    if PREC == "tf32":
        bits = x.to(tl.int32, bitcast=True)
        special = (bits & 0x7F800000) == 0x7F800000
        x = tl.where(special, x, ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True))
    return x


@triton.jit
def gated_left(x, eG, scale, dtype: tl.constexpr):
    """``scale x e^G`` ``[R, BK]`` rounded to ``dtype``: the left operand of an output's state term from an fp32 tile x
    and its decay ``eG = decay(G)`` (G a gate tile or an exponent), GLA's (``output.state_term``, in the states'
    dtype) and KDA's (``kda.front``, where its serial pass's operands are formed)."""
    return (x * (eG * scale)).to(dtype)


@triton.jit
def key_head(h, H, GROUP):
    """``(head, heads)`` of the query/key tensors that value head h of H reads: grouped value heads, GROUP of them a
    query/key head (Gated DeltaNet's GVA; 1 where q, k and v have the same heads)."""
    return h // GROUP, H // GROUP


@triton.jit
def selected(i, sel_ptr, SELECT: tl.constexpr):
    """Program index i of a launch over a ``common.Selection``: with ``SELECT`` ``sel[i]`` (the sequence or chunk it
    lists), else i."""
    if SELECT:
        i = tl.load(sel_ptr + i)
    return i


@triton.jit
def chunk_span(c, cu_ptr, seq_ptr, start_ptr, C: tl.constexpr):
    """First token and number of valid rows (<= C) of chunk c."""
    t0 = tl.load(start_ptr + c)
    eos = tl.load(cu_ptr + tl.load(seq_ptr + c) + 1)
    return t0, tl.minimum(eos - t0, C)


@triton.jit
def chunk_rows(c, cu_ptr, seq_ptr, start_ptr, C: tl.constexpr):
    """``(t0, n, i, rows, rmask, grows)`` of chunk c: its first token, valid rows, row indices, token
    rows (masked past the end) and token rows clamped to the last valid one (for G)."""
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    i = tl.arange(0, C)
    return t0, n, i, t0 + i, i < n, t0 + tl.minimum(i, n - 1)
