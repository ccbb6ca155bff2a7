"""The forward's chunk matrices by sub-chunk blocks: Akk, Aqk and the WY inverse.

A chunk of C = 64 rows is cut into four sub-chunks of BC = 16 (blocks b = 0..3, chunk rows
``16 b + i``). Every matrix here is lower block-triangular, so it is held by block diagonals: ``X_d``
(d = 0..3) is a ``[4, BC, BC]`` tile whose slice b is the block ``(b, b - d)`` (zero where b < d).
Each product is a batched dot over the four slices, ``[4, BC, BK] x [4, BK, BC]``: no block above the
diagonal is ever computed, and the warps split the slices (a ``[C, C]`` tile held 255 registers and
spilled; ten separate ``[BC, BC]`` tiles, each replicated over the program's four warps, spilled 6 KB a
thread, Triton 3.6 for sm_90).

With ``G`` the chunk-local cumulative log-decay (non-increasing along the rows: ``g <= 0``):

    A_ij = sum_d k_id k_jd e^{G_id - G_jd}  (j < i),    P_ij = sum_d q_id k_jd e^{G_id - G_jd}  (j <= i)

* below the diagonal (d >= 1), the reference row r = 16 b, the first row of block b:
  ``e^{G_i - G_r} e^{G_r - G_j}``, both factors in (0, 1] (j < r <= i), whatever the decay.
* on the diagonal (d = 0), as ``subchunk`` sums the ``[C, C]`` forms (its docstring has the bounds): by
  dots against each block's middle row (``pair_blocks``), trusted where the decay inside the blocks allows
  it (``max |G - G_m| <= DIAG_SPAN``: always under safe_gate's promise); elsewhere (the general path's
  flagged chunks, ``chunk_fwd.intra``) exactly, a row at a time in a kernel of their own (``diag_row``,
  ``chunk_fwd.diag_rows_kernel``), each factor ``e^{G_i - G_j}`` formed on its own, for any decay.

The inverse ``T = (I + L)^{-1}``, ``L = Diag(beta) A``: the diagonal blocks by exact doubling inside
each 16 x 16 slice (at ``DPREC``), then block forward substitution, one block diagonal at a time (at
``PREC``):

    T_bc = - T_bb sum_{c <= e < b} L_be T_ec

Block rows of other blocks (``T_{b-s, b-s-d}``, the rows of block ``b - d``) are read back from memory:
the diagonals of T are stored as they are formed, and a barrier makes them visible to the program's
other threads.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..chunk.tiles import decay
from .subchunk import level_pairs

NB = tl.constexpr(4)  # sub-chunks per chunk


@triton.jit
def shifted_rows(t0, n, s: tl.constexpr, offset, R: tl.constexpr, BC: tl.constexpr):
    """``(c, valid, clamped)`` ``[NB, R, 1]``: the chunk rows ``BC (b - s) + offset + i`` (i < R) for every
    block b, whether each is a valid row (``b >= s``, ``c < n``), and the rows clamped into ``[0, n)``
    (for G, so that padded rows decay nothing)."""
    b = tl.arange(0, NB)[:, None, None]
    c = (b - s) * BC + offset + tl.arange(0, R)[None, :, None]
    return c, (b >= s) & (c < n), tl.minimum(tl.maximum(c, 0), n - 1)


@triton.jit
def load_rows(ptr, t0, c, valid, h, H, D, cols, cmask):
    """``x[t0 + c, h, cols]`` of a ``[T, H, D]`` tensor (``cols`` ``[1, 1, BD]``) in its stored dtype, zero
    where not valid."""
    base = ptr + (t0.to(tl.int64) * H + h) * D
    return tl.load(base + c * (H * D) + cols, mask=valid & cmask, other=0.0)


@triton.jit
def block_x(ptr, t0, n, s: tl.constexpr, h, H, D, cols, cmask, BC: tl.constexpr):
    """``x`` of block ``b - s`` in slice b, ``[NB, BC, BD]`` (zero where b < s)."""
    c, valid, _ = shifted_rows(t0, n, s, 0, BC, BC)
    return load_rows(ptr, t0, c, valid, h, H, D, cols, cmask).to(tl.float32)


@triton.jit
def block_gate(G_ptr, t0, n, s: tl.constexpr, offset, R: tl.constexpr, h, H, K, cols, cmask, BC: tl.constexpr):
    """``G`` at rows ``offset .. offset + R - 1`` of block ``b - s`` in slice b, rows clamped, ``[NB, R, BK]``, in
    its stored dtype (fp64 for fp32 inputs: exponents are differences taken in it, ``decay``)."""
    _, _, clamped = shifted_rows(t0, n, s, offset, R, BC)
    return load_rows(G_ptr, t0, clamped, clamped >= 0, h, H, K, cols, cmask)


@triton.jit
def trans3(x):
    return tl.trans(x, 0, 2, 1)


@triton.jit
def below(A, P, k_left, q_left, k_ptr, G_ptr, G_r, t0, n, d: tl.constexpr, h, H, K, cols, cmask,
          BC: tl.constexpr, PREC: tl.constexpr):
    """Add one channel block to diagonal d >= 1: the left operands carry ``e^{G_i - G_r}``, the right one
    ``e^{G_r - G_j}`` is formed here from block ``b - d``'s k and G."""
    G_j = block_gate(G_ptr, t0, n, d, 0, BC, h, H, K, cols, cmask, BC)
    right = trans3(block_x(k_ptr, t0, n, d, h, H, K, cols, cmask, BC) * decay(G_r - G_j))
    return A + tl.dot(k_left, right, input_precision=PREC), P + tl.dot(q_left, right, input_precision=PREC)


@triton.jit
def diag_dots(A, P, k, q, G, G_m, BC: tl.constexpr, DPREC: tl.constexpr):
    """Add one channel block to the diagonal blocks by dots against their middle rows m:
    ``e^{G_i - G_m} e^{G_m - G_j}`` (A strictly lower, P with the diagonal)."""
    i = tl.arange(0, BC)
    right = trans3(k * decay(G_m - G))
    el = decay(G - G_m)
    A += tl.where((i[:, None] > i[None, :])[None], tl.dot(k * el, right, input_precision=DPREC), 0.0)
    P += tl.where((i[:, None] >= i[None, :])[None], tl.dot(q * el, right, input_precision=DPREC), 0.0)
    return A, P


@triton.jit
def diag_row(k_j, G_j, j, i, k_i, q_i, G_i):
    """Row i of the diagonal block of its sub-chunk, exactly for any decay: ``(A_ij, P_ij)`` for the sub-chunk's
    rows j ``[BC]`` (both zero for j > i, and A's j = i the solve does not read, ``block_inverse``) from their
    ``k_j``, ``G_j`` ``[BC, BK]`` and row i's ``k_i``, ``q_i``, ``G_i`` ``[BK]``: each factor ``e^{G_id - G_jd}`` (in
    (0, 1] for j <= i) formed on its own, those of j > i as ``e^{-inf} = 0``, so that nothing overflows."""
    kj_e = k_j * decay(tl.where((j <= i)[:, None], G_i[None, :] - G_j, float("-inf")))
    return tl.sum(k_i[None, :] * kj_e, axis=1), tl.sum(q_i[None, :] * kj_e, axis=1)


@triton.jit
def pair_blocks(q_ptr, k_ptr, G_ptr, t0, n, h, H, K, BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                DPREC: tl.constexpr):
    """The block diagonals ``A_0..A_3`` (strictly lower) and ``P_0..P_3`` (lower, unscaled), summed over
    the channels in blocks of BK, the diagonal blocks by dots against their middle rows, and the largest
    ``|G - G_m|`` inside a sub-chunk (``[NB, BC, BK]``, by channel block): where it exceeds ``DIAG_SPAN``,
    the diagonal blocks are not to be trusted (module docstring)."""
    A0 = tl.zeros((NB, BC, BC), tl.float32)
    A1, A2, A3, P0, P1, P2, P3 = A0, A0, A0, A0, A0, A0, A0
    ck = tl.arange(0, BK)[None, None, :]
    span = tl.zeros((NB, BC, BK), tl.float32)
    for k0 in range(0, K, BK):
        cmask = k0 + ck < K
        qp, kp, Gp = q_ptr + k0, k_ptr + k0, G_ptr + k0
        k = block_x(kp, t0, n, 0, h, H, K, ck, cmask, BC)
        q = block_x(qp, t0, n, 0, h, H, K, ck, cmask, BC)
        G = block_gate(Gp, t0, n, 0, 0, BC, h, H, K, ck, cmask, BC)
        G_r = block_gate(Gp, t0, n, 0, 0, 1, h, H, K, ck, cmask, BC)
        e = decay(G - G_r)
        A1, P1 = below(A1, P1, k * e, q * e, kp, Gp, G_r, t0, n, 1, h, H, K, ck, cmask, BC, PREC)
        A2, P2 = below(A2, P2, k * e, q * e, kp, Gp, G_r, t0, n, 2, h, H, K, ck, cmask, BC, PREC)
        A3, P3 = below(A3, P3, k * e, q * e, kp, Gp, G_r, t0, n, 3, h, H, K, ck, cmask, BC, PREC)
        G_m = block_gate(Gp, t0, n, 0, BC // 2, 1, h, H, K, ck, cmask, BC)
        A0, P0 = diag_dots(A0, P0, k, q, G, G_m, BC, DPREC)
        span = tl.maximum(span, tl.abs(G - G_m).to(tl.float32))  # G is fp64 for fp32 inputs
    return A0, A1, A2, A3, P0, P1, P2, P3, span


# ------------------------------------------------------------------------------- block diagonals in memory


@triton.jit
def diag_ptrs(ptr, t0, n, s: tl.constexpr, d: tl.constexpr, h, H, C: tl.constexpr, BC: tl.constexpr):
    """Pointers and mask of block ``(b - s, b - s - d)`` for every slice b in a ``[T, H, C]`` chunk matrix
    (row t of a chunk holds its row); valid where that block lies in the chunk (d < 0: above the
    diagonal) and its row is a valid row."""
    c, valid, _ = shifted_rows(t0, n, s, 0, BC, BC)
    b = tl.arange(0, NB)[:, None, None]
    col = (b - s - d) * BC + tl.arange(0, BC)[None, None, :]
    valid = valid & (b - s - d >= 0) & (b - s - d < NB)
    return ptr + (t0.to(tl.int64) * H + h) * C + c * (H * C) + col, valid


@triton.jit
def store_diag(ptr, x, t0, n, d: tl.constexpr, h, H, C: tl.constexpr, BC: tl.constexpr):
    p, valid = diag_ptrs(ptr, t0, n, 0, d, h, H, C, BC)
    tl.store(p, x.to(ptr.dtype.element_ty), mask=valid)


@triton.jit
def load_diag(ptr, t0, n, s: tl.constexpr, d: tl.constexpr, h, H, C: tl.constexpr, BC: tl.constexpr):
    """Diagonal d of a stored chunk matrix, moved s slices down: slice b holds block ``(b - s, b - s - d)``."""
    p, valid = diag_ptrs(ptr, t0, n, s, d, h, H, C, BC)
    return tl.load(p, mask=valid, other=0.0)


@triton.jit
def store_zeros_above(ptr, t0, n, h, H, C: tl.constexpr, BC: tl.constexpr):
    """Zeros into the blocks above the diagonal of a stored chunk matrix."""
    zero = tl.zeros((NB, BC, BC), tl.float32)
    store_diag(ptr, zero, t0, n, -1, h, H, C, BC)
    store_diag(ptr, zero, t0, n, -2, h, H, C, BC)
    store_diag(ptr, zero, t0, n, -3, h, H, C, BC)


@triton.jit
def store_below(ptr, scale, X1, X2, X3, t0, n, h, H, C: tl.constexpr, BC: tl.constexpr):
    """The block diagonals 1..3 of a chunk matrix times ``scale``."""
    store_diag(ptr, scale * X1, t0, n, 1, h, H, C, BC)
    store_diag(ptr, scale * X2, t0, n, 2, h, H, C, BC)
    store_diag(ptr, scale * X3, t0, n, 3, h, H, C, BC)


@triton.jit
def store_lower(ptr, scale, X0, X1, X2, X3, t0, n, h, H, C: tl.constexpr, BC: tl.constexpr):
    """A lower block-triangular chunk matrix times ``scale``, and zeros above the diagonal blocks."""
    store_diag(ptr, scale * X0, t0, n, 0, h, H, C, BC)
    store_below(ptr, scale, X1, X2, X3, t0, n, h, H, C, BC)
    store_zeros_above(ptr, t0, n, h, H, C, BC)


# -------------------------------------------------------------------------------------------- solve


@triton.jit
def block_inverse(L, BC: tl.constexpr, DPREC: tl.constexpr):
    """``(I + L)^{-1}`` of every slice of a strictly lower ``[NB, 16, 16]`` tile by exact doubling: with
    ``X_s`` the inverse of ``I`` plus the part of L inside diagonal s-blocks and ``E_s`` the part that
    ``level_pairs(s)`` selects, ``X_{2s} = (I - X_s E_s) X_s`` (exact: ``(X_s E_s)^2 = 0``); ``X_2 = I - E_1``."""
    tl.static_assert(BC == 16, "the doubling levels 2, 4, 8 assume sub-chunks of 16")
    i = tl.arange(0, BC)
    X = (i[:, None] == i[None, :]).to(tl.float32)[None] - tl.where(level_pairs(1, BC)[None], L, 0.0)
    for lvl in tl.static_range(1, 4):
        E = tl.where(level_pairs(1 << lvl, BC)[None], L, 0.0)
        X = X - tl.dot(tl.dot(X, E, input_precision=DPREC), X, input_precision=DPREC)
    return X


@triton.jit
def block_beta(beta_ptr, t0, n, s: tl.constexpr, h, H, BC: tl.constexpr):
    """beta of block ``b - s``'s rows in slice b, ``[NB, BC, 1]`` (zero past the chunk's end)."""
    c, valid, _ = shifted_rows(t0, n, s, 0, BC, BC)
    return load_rows(beta_ptr, t0, c, valid, h, H, 1, 0, True).to(tl.float32)


@triton.jit
def solve(T_ptr, A0, A1, A2, A3, beta, t0, n, h, H, C: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr,
          DPREC: tl.constexpr):
    """The block diagonals ``T_0..T_3`` of ``T = (I + Diag(beta) A)^{-1}`` (beta ``[NB, BC, 1]``), each
    stored into T as it is formed (the next one reads the earlier ones' rows back)."""
    T0 = block_inverse(beta * A0, BC, DPREC)
    store_diag(T_ptr, T0, t0, n, 0, h, H, C, BC)
    tl.debug_barrier()
    L1 = beta * A1
    T1 = -tl.dot(T0, tl.dot(L1, load_diag(T_ptr, t0, n, 1, 0, h, H, C, BC), input_precision=PREC),
                 input_precision=PREC)
    store_diag(T_ptr, T1, t0, n, 1, h, H, C, BC)
    tl.debug_barrier()
    L2 = beta * A2
    S = tl.dot(L2, load_diag(T_ptr, t0, n, 2, 0, h, H, C, BC), input_precision=PREC)
    T2 = -tl.dot(T0, tl.dot(L1, load_diag(T_ptr, t0, n, 1, 1, h, H, C, BC), S, input_precision=PREC),
                 input_precision=PREC)
    store_diag(T_ptr, T2, t0, n, 2, h, H, C, BC)
    tl.debug_barrier()
    S = tl.dot(beta * A3, load_diag(T_ptr, t0, n, 3, 0, h, H, C, BC), input_precision=PREC)
    S = tl.dot(L2, load_diag(T_ptr, t0, n, 2, 1, h, H, C, BC), S, input_precision=PREC)
    T3 = -tl.dot(T0, tl.dot(L1, load_diag(T_ptr, t0, n, 1, 2, h, H, C, BC), S, input_precision=PREC),
                 input_precision=PREC)
    store_diag(T_ptr, T3, t0, n, 3, h, H, C, BC)
    store_zeros_above(T_ptr, t0, n, h, H, C, BC)
