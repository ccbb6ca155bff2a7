"""The forward's chunk matrices by sub-chunk blocks: Akk, Aqk and the WY inverse.

A chunk of C = 64 rows is cut into four sub-chunks of BC = 16 (blocks b = 0..3, chunk rows ``16 b + i``). Every
matrix here is lower block-triangular; each block ``(b, c)``, c <= b, is a ``[BC, BC]`` tile summed over the
channels in ``[BC, BK]`` tiles of q, k and G, so that no block above the diagonal is ever formed. With ``G`` the
chunk-local cumulative log-decay (non-increasing along the rows: ``g <= 0``):

    A_ij = sum_d k_id k_jd e^{G_id - G_jd}  (j < i),    P_ij = sum_d q_id k_jd e^{G_id - G_jd}  (j <= i)
    T = (I + L)^{-1},    L = Diag(beta) A

Split as FLA's forward splits them (``chunk_fwd.intra``'s launches):

* the diagonal blocks, one program per sub-chunk (``diag_block``): by dots against the block's middle row m,
  ``e^{G_i - G_m} e^{G_m - G_j}``, trusted where the decay inside the block allows it (``max |G - G_m| <=
  DIAG_SPAN``, always under safe_gate's promise; ``subchunk``'s docstring has the bounds; the front flags the others,
  ``span_flags``), at ``DPREC``; elsewhere
  (the general path's flagged sub-chunks, in a kernel of their own: ``chunk_fwd.exact_kernel``) exactly, a row at a
  time, every factor ``e^{G_i - G_j}`` in (0, 1], for any decay. Then the block's inverse ``T_bb = (I + L_bb)^{-1}`` by
  exact doubling (``unit_inverse``).
* the blocks below the diagonal, one program per chunk (``below_blocks``): against the reference row r = 16 b, the
  first row of block b, ``e^{G_i - G_r} e^{G_r - G_j}``, both factors in (0, 1] (j < r <= i) whatever the decay;
  then block forward substitution from the diagonal inverses (``below_inverse``, at ``PREC``):

      T_bc = - T_bb sum_{c <= e < b} L_be T_ec

Not kept: one program per chunk forming every block as ``[4, 16, 16]`` block diagonals (batched dots over the four
slices, a quarter to three quarters of each masked off) and solving in the same program: 255 registers, two programs
an SM, bound by the waits of its dependent dots; 0.855 ms for ``intra`` where the three launches take 0.575 (H200,
bf16, B=8, T=4096, H=16, K=128, at a17baeb; ``docs/kernels/kda.md``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..chunk.scaled import pow2_at_or_above, pow2_reciprocal
from ..chunk.tiles import decay, load_gate, load_gate_row, load_rowvec, load_tile, row_offsets, tf32_nearest
from .subchunk import DIAG_SPAN, level_pairs, sub_rows

NB = tl.constexpr(4)  # sub-chunks per chunk


@triton.jit
def sub_keys(q_ptr, k_ptr, t0, n, s, h, H, K, cols, cmask, BC: tl.constexpr):
    """q and k of sub-chunk s (fp32, zero past the chunk's n valid rows), ``[BC, BK]`` each."""
    _, rows, live, _ = sub_rows(t0, n, s, BC)
    return load_tile(q_ptr, rows, live, h, H, K, cols, cmask), load_tile(k_ptr, rows, live, h, H, K, cols, cmask)


@triton.jit
def sub_tiles(q_ptr, k_ptr, G_ptr, t0, n, s, h, H, K, cols, cmask, BC: tl.constexpr):
    """q and k (``sub_keys``) and G (rows clamped to the last valid one, in its stored dtype) of sub-chunk s,
    ``[BC, BK]`` each."""
    _, _, _, grows = sub_rows(t0, n, s, BC)
    q, k = sub_keys(q_ptr, k_ptr, t0, n, s, h, H, K, cols, cmask, BC)
    return q, k, load_gate(G_ptr, grows, grows >= 0, h, H, K, cols, cmask)


@triton.jit
def sub_gate(G_ptr, t0, n, s, h, H, BC: tl.constexpr):
    """Sub-chunk s's rows ``[BC]`` (clamped to the last valid one) of a ``[T, H]`` gate, in its stored dtype."""
    _, _, _, grows = sub_rows(t0, n, s, BC)
    return tl.load(G_ptr + row_offsets(grows, h, H, 1), mask=grows >= 0, other=0.0)


@triton.jit
def cross_decay(G_i, G_j):
    """``e^{G_i - G_j}`` ``[BC, BC]`` of two sub-chunks' scalar gates, rows i after columns j: in (0, 1]."""
    return decay(G_i[:, None] - G_j[None, :])


@triton.jit
def pair_decays(G, i, STRICT: tl.constexpr):
    """``e^{G_i - G_j}`` ``[R, R]`` of a chunk's or sub-chunk's scalar cumulative gate G ``[R]`` (rows i) for the rows i
    after the columns j (with ``STRICT``; else at or after them), zero elsewhere: every factor in (0, 1], for any
    decay (``diag_block``'s ``SCALAR``, ``chunk_bwd.scalar_pairs_kernel``)."""
    lower = (i[:, None] > i[None, :]) if STRICT else (i[:, None] >= i[None, :])
    return tl.where(lower, decay(tl.where(lower, G[:, None] - G[None, :], 0.0)), 0.0)


@triton.jit
def ref_row(G_ptr, t0, n, r, h, H, K, cols, cmask):
    """G's chunk row r (clamped to the last valid row) ``[1, BK]``."""
    return load_gate_row(G_ptr, t0 + tl.minimum(r, n - 1), h, H, K, cols, cmask)[None, :]


@triton.jit
def diag_block(q_ptr, k_ptr, G_ptr, t0, n, s, h, H, K, BC: tl.constexpr, BK: tl.constexpr, DPREC: tl.constexpr,
               SCALAR: tl.constexpr = False, hk=0, HK=1):
    """``(A_ss, P_ss)``: sub-chunk s's diagonal blocks of A (strictly lower) and P (lower, unscaled) by dots against its
    middle row m (trusted where the sub-chunk's span allows them, ``span_flags``). With ``SCALAR`` (a ``[T, H]``
    gate, one decay per head: Gated DeltaNet) the decay leaves the sum, ``A_ij = (k_i . k_j) e^{G_i - G_j}``: plain
    dots of q and k (head hk of ``[T, HK, K]``: grouped value heads), weighed afterwards by factors in (0, 1], for any
    decay (no span to trust)."""
    i = tl.arange(0, BC)
    A = tl.zeros((BC, BC), tl.float32)
    P = tl.zeros((BC, BC), tl.float32)
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        cmask = cols < K
        if SCALAR:
            q, k = sub_keys(q_ptr, k_ptr, t0, n, s, hk, HK, K, cols, cmask, BC)
            right = tf32_nearest(tl.trans(k), DPREC)
            A += tl.dot(tf32_nearest(k, DPREC), right, input_precision=DPREC)
            P += tl.dot(tf32_nearest(q, DPREC), right, input_precision=DPREC)
        else:
            q, k, G = sub_tiles(q_ptr, k_ptr, G_ptr, t0, n, s, h, H, K, cols, cmask, BC)
            d = G - ref_row(G_ptr, t0, n, s * BC + BC // 2, h, H, K, cols, cmask)
            el = decay(d)
            right = tf32_nearest(tl.trans(k * decay(-d)), DPREC)
            A += tl.dot(tf32_nearest(k * el, DPREC), right, input_precision=DPREC)
            P += tl.dot(tf32_nearest(q * el, DPREC), right, input_precision=DPREC)
    if SCALAR:
        D = pair_decays(sub_gate(G_ptr, t0, n, s, h, H, BC), i, False)
        A = A * D
        P = P * D
    return tl.where(i[:, None] > i[None, :], A, 0.0), tl.where(i[:, None] >= i[None, :], P, 0.0)


@triton.jit
def span_flags(G, G_ptr, flag_ptr, c, t0, n, h, H, K, cols, cmask, C: tl.constexpr, BC: tl.constexpr):
    """Flag the sub-chunks of chunk c whose diagonal blocks the dots against the middle row m would not give: bit s of
    ``flag[c, h]`` (OR-ed in) where ``max |G - G_m|`` over sub-chunk s's rows and the tile's channels exceeds
    ``DIAG_SPAN``, from the chunk's tile ``G [C, KB]`` (rows clamped to the last valid one), in the program that
    holds it (``front.front_kernel``; a row's channel blocks in programs of their own each OR their bits)."""
    i = tl.arange(0, C)
    mid = t0 + tl.minimum((i // BC) * BC + BC // 2, n - 1)
    rows = tl.max(tl.abs(G - load_gate(G_ptr, mid, mid >= 0, h, H, K, cols, cmask)).to(tl.float32), axis=1)
    span = tl.max(tl.reshape(rows, (NB, BC)), axis=1)  # G is fp64 for fp32 inputs
    s = tl.arange(0, NB)
    bits = tl.sum(tl.where((span <= DIAG_SPAN) | (s * BC >= n), 0, 1 << s), axis=0)  # a NaN span flagged too
    if bits != 0:
        tl.atomic_or(flag_ptr + c.to(tl.int64) * H + h, bits)


@triton.jit
def unit_inverse(L, BC: tl.constexpr, DPREC: tl.constexpr):
    """``(I + L)^{-1}`` of a strictly lower ``[16, 16]`` L (entries on and above the diagonal are not read) by exact
    doubling: with ``X_s`` the inverse of ``I`` plus the part of L inside diagonal s-blocks and ``E_s`` the part that
    ``level_pairs(s)`` selects, ``X_{2s} = (I - X_s E_s) X_s`` (exact: ``(X_s E_s)^2 = 0``); ``X_2 = I - E_1``."""
    tl.static_assert(BC == 16, "the doubling levels 2, 4, 8 assume sub-chunks of 16")
    i = tl.arange(0, BC)
    X = (i[:, None] == i[None, :]).to(tl.float32) - tl.where(level_pairs(1, BC), L, 0.0)
    for lvl in tl.static_range(1, 4):
        E = tf32_nearest(tl.where(level_pairs(1 << lvl, BC), L, 0.0), DPREC)
        Xr = tf32_nearest(X, DPREC)
        X = X - tl.dot(tf32_nearest(tl.dot(Xr, E, input_precision=DPREC), DPREC), Xr, input_precision=DPREC)
    return X


@triton.jit
def pair_operand(x, HALF: tl.constexpr):
    """An operand of the blocks below the diagonal (an fp32 tile): with ``HALF`` rounded to fp16 (``below_blocks``)."""
    if HALF:
        x = x.to(tl.float16)
    return x


@triton.jit
def below_pair(A, P, k_b, q_b, k_c, G_c, G_r, PREC: tl.constexpr, HALF: tl.constexpr):
    """Add one channel block to the blocks ``(b, c)`` of A and P, c < b: the left operands ``k_b``, ``q_b`` carry
    ``e^{G_i - G_r}`` already (``pair_operand``s), the right one ``e^{G_r - G_j}`` is formed here from block c's k and
    G."""
    right = pair_operand(tl.trans(k_c * decay(G_r - G_c)), HALF)
    return A + tl.dot(k_b, right, input_precision=PREC), P + tl.dot(q_b, right, input_precision=PREC)


@triton.jit
def below_blocks(q_ptr, k_ptr, G_ptr, t0, n, h, H, K, BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                 HALF: tl.constexpr):
    """The six blocks below the diagonal of A and of P (unscaled), ``(b, c)`` for c < b, summed over the channels in
    blocks of BK against the first row of block b (module docstring). With ``HALF`` (q's and k's rows of unit length)
    the dots take their operands rounded to fp16: every factor of an operand lies in [-1, 1] (the decays in (0, 1]), so
    each keeps fp16's 11 significant bits rounded to nearest (a "tf32" dot truncates its fp32 operands to as many)
    down to 2^-14, below it an absolute 2^-25."""
    A10 = tl.zeros((BC, BC), tl.float32)
    A20, A21, A30, A31, A32, P10, P20, P21, P30, P31, P32 = A10, A10, A10, A10, A10, A10, A10, A10, A10, A10, A10
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        cmask = cols < K
        _, k0, G0 = sub_tiles(q_ptr, k_ptr, G_ptr, t0, n, 0, h, H, K, cols, cmask, BC)
        q1, k1, G1 = sub_tiles(q_ptr, k_ptr, G_ptr, t0, n, 1, h, H, K, cols, cmask, BC)
        q2, k2, G2 = sub_tiles(q_ptr, k_ptr, G_ptr, t0, n, 2, h, H, K, cols, cmask, BC)
        q3, k3, G3 = sub_tiles(q_ptr, k_ptr, G_ptr, t0, n, 3, h, H, K, cols, cmask, BC)
        G_r = ref_row(G_ptr, t0, n, BC, h, H, K, cols, cmask)
        e = decay(G1 - G_r)
        kb, qb = pair_operand(k1 * e, HALF), pair_operand(q1 * e, HALF)
        A10, P10 = below_pair(A10, P10, kb, qb, k0, G0, G_r, PREC, HALF)
        G_r = ref_row(G_ptr, t0, n, 2 * BC, h, H, K, cols, cmask)
        e = decay(G2 - G_r)
        kb, qb = pair_operand(k2 * e, HALF), pair_operand(q2 * e, HALF)
        A20, P20 = below_pair(A20, P20, kb, qb, k0, G0, G_r, PREC, HALF)
        A21, P21 = below_pair(A21, P21, kb, qb, k1, G1, G_r, PREC, HALF)
        G_r = ref_row(G_ptr, t0, n, 3 * BC, h, H, K, cols, cmask)
        e = decay(G3 - G_r)
        kb, qb = pair_operand(k3 * e, HALF), pair_operand(q3 * e, HALF)
        A30, P30 = below_pair(A30, P30, kb, qb, k0, G0, G_r, PREC, HALF)
        A31, P31 = below_pair(A31, P31, kb, qb, k1, G1, G_r, PREC, HALF)
        A32, P32 = below_pair(A32, P32, kb, qb, k2, G2, G_r, PREC, HALF)
    return A10, A20, A21, A30, A31, A32, P10, P20, P21, P30, P31, P32


@triton.jit
def below_dots(A, P, k_b, q_b, right, PREC: tl.constexpr):
    """One channel block's plain dots into the blocks ``(b, c)`` of A and P (``below_scalar``)."""
    return A + tl.dot(k_b, right, input_precision=PREC), P + tl.dot(q_b, right, input_precision=PREC)


@triton.jit
def below_scalar(q_ptr, k_ptr, G_ptr, t0, n, h, H, hk, HK, K, BC: tl.constexpr, BK: tl.constexpr,
                 PREC: tl.constexpr, HALF: tl.constexpr):
    """``below_blocks`` for a ``[T, H]`` gate (one decay per head): plain dots of q and k (head hk of ``[T, HK, K]``)
    over the channels, each block weighed afterwards by ``e^{G_i - G_j}`` (``cross_decay``, in (0, 1]); with ``HALF``
    their operands in fp16 (q's and k's rows of unit length)."""
    A10 = tl.zeros((BC, BC), tl.float32)
    A20, A21, A30, A31, A32, P10, P20, P21, P30, P31, P32 = A10, A10, A10, A10, A10, A10, A10, A10, A10, A10, A10
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        cmask = cols < K
        _, k0 = sub_keys(q_ptr, k_ptr, t0, n, 0, hk, HK, K, cols, cmask, BC)
        q1, k1 = sub_keys(q_ptr, k_ptr, t0, n, 1, hk, HK, K, cols, cmask, BC)
        q2, k2 = sub_keys(q_ptr, k_ptr, t0, n, 2, hk, HK, K, cols, cmask, BC)
        q3, k3 = sub_keys(q_ptr, k_ptr, t0, n, 3, hk, HK, K, cols, cmask, BC)
        r0, r1, r2 = (pair_operand(tl.trans(k0), HALF), pair_operand(tl.trans(k1), HALF),
                      pair_operand(tl.trans(k2), HALF))
        kb, qb = pair_operand(k1, HALF), pair_operand(q1, HALF)
        A10, P10 = below_dots(A10, P10, kb, qb, r0, PREC)
        kb, qb = pair_operand(k2, HALF), pair_operand(q2, HALF)
        A20, P20 = below_dots(A20, P20, kb, qb, r0, PREC)
        A21, P21 = below_dots(A21, P21, kb, qb, r1, PREC)
        kb, qb = pair_operand(k3, HALF), pair_operand(q3, HALF)
        A30, P30 = below_dots(A30, P30, kb, qb, r0, PREC)
        A31, P31 = below_dots(A31, P31, kb, qb, r1, PREC)
        A32, P32 = below_dots(A32, P32, kb, qb, r2, PREC)
    G0, G1 = sub_gate(G_ptr, t0, n, 0, h, H, BC), sub_gate(G_ptr, t0, n, 1, h, H, BC)
    G2, G3 = sub_gate(G_ptr, t0, n, 2, h, H, BC), sub_gate(G_ptr, t0, n, 3, h, H, BC)
    e10, e20, e21 = cross_decay(G1, G0), cross_decay(G2, G0), cross_decay(G2, G1)
    e30, e31, e32 = cross_decay(G3, G0), cross_decay(G3, G1), cross_decay(G3, G2)
    return (A10 * e10, A20 * e20, A21 * e21, A30 * e30, A31 * e31, A32 * e32,
            P10 * e10, P20 * e20, P21 * e21, P30 * e30, P31 * e31, P32 * e32)


@triton.jit
def below_inverse(T00, T11, T22, T33, L10, L20, L21, L30, L31, L32, PREC: tl.constexpr):
    """The blocks below the diagonal of ``T = (I + L)^{-1}`` from its diagonal blocks and L's blocks below the
    diagonal, by block forward substitution (module docstring)."""
    T10 = -tl.dot(T11, tl.dot(L10, T00, input_precision=PREC), input_precision=PREC)
    T21 = -tl.dot(T22, tl.dot(L21, T11, input_precision=PREC), input_precision=PREC)
    T20 = -tl.dot(T22, tl.dot(L21, T10, tl.dot(L20, T00, input_precision=PREC), input_precision=PREC),
                  input_precision=PREC)
    T32 = -tl.dot(T33, tl.dot(L32, T22, input_precision=PREC), input_precision=PREC)
    T31 = -tl.dot(T33, tl.dot(L32, T21, tl.dot(L31, T11, input_precision=PREC), input_precision=PREC),
                  input_precision=PREC)
    S = tl.dot(L31, T10, tl.dot(L30, T00, input_precision=PREC), input_precision=PREC)
    T30 = -tl.dot(T33, tl.dot(L32, T20, S, input_precision=PREC), input_precision=PREC)
    return T10, T20, T21, T30, T31, T32


# ------------------------------------------------------------------------------- blocks in memory


@triton.jit
def block_ptrs(ptr, t0, n, s, c, h, H, C: tl.constexpr, BC: tl.constexpr):
    """Pointers and mask of block ``(s, c)`` of a ``[T, H, C]`` chunk matrix (row t of a chunk holds its row of the
    chunk matrix): sub-chunk s's valid rows, sub-chunk c's columns."""
    i, rows, live, _ = sub_rows(t0, n, s, BC)
    cols = c * BC + tl.arange(0, BC)
    return ptr + ((t0 + i).to(tl.int64) * H + h)[:, None] * C + cols[None, :], live[:, None] & (cols < C)[None, :]


@triton.jit
def store_block(ptr, x, t0, n, s, c, h, H, C: tl.constexpr, BC: tl.constexpr):
    p, mask = block_ptrs(ptr, t0, n, s, c, h, H, C, BC)
    tl.store(p, x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_block(ptr, t0, n, s, c, h, H, C: tl.constexpr, BC: tl.constexpr):
    """Block ``(s, c)`` (fp32, zero in the rows past the chunk's end)."""
    p, mask = block_ptrs(ptr, t0, n, s, c, h, H, C, BC)
    return tl.load(p, mask=mask, other=0.0)


@triton.jit
def store_diag_inverse(D_ptr, beta_ptr, A, t0, n, s, h, H, BC: tl.constexpr, DPREC: tl.constexpr):
    """Sub-chunk s's diagonal block of T from its block of A, ``T_ss = (I + Diag(beta) A_ss)^{-1}`` (``unit_inverse``
    at ``DPREC``), into the diagonal blocks' array ``[T, H, BC]`` (``below_kernel`` writes T whole from them)."""
    store_block(D_ptr, unit_inverse(block_beta(beta_ptr, t0, n, s, h, H, BC) * A, BC, DPREC), t0, n, s, 0, h, H, BC,
                BC)


@triton.jit
def store_t_rows(T_ptr, s_ptr, X0, X1, X2, X3, t0, n, b, h, H, C: tl.constexpr, BC: tl.constexpr,
                 SCALED: tl.constexpr):
    """Sub-chunk b's rows of T, its four blocks ``X0..X3`` (zeros right of the diagonal), whole: with ``SCALED``
    row-scaled (``chunk.scaled``, one scale a row, ``[T, H, 1]`` at s_ptr; a row's largest entry is its diagonal's 1
    or more, so fp16 keeps every entry to an absolute error under ``2^-25`` of it), else as they are."""
    p, mask = block_ptrs(T_ptr, t0, n, b, 0, h, H, C, BC)
    if SCALED:
        m = tl.maximum(tl.maximum(tl.max(tl.abs(X0), axis=1), tl.max(tl.abs(X1), axis=1)),
                       tl.maximum(tl.max(tl.abs(X2), axis=1), tl.max(tl.abs(X3), axis=1)))
        sc = pow2_at_or_above(m)
        r = pow2_reciprocal(sc)[:, None]
        X0, X1, X2, X3 = X0 * r, X1 * r, X2 * r, X3 * r
        _, rows, live, _ = sub_rows(t0, n, b, BC)
        tl.store(s_ptr + rows.to(tl.int64) * H + h, sc, mask=live)
    dtype = T_ptr.dtype.element_ty
    tl.store(p, X0.to(dtype), mask=mask)
    tl.store(p + BC, X1.to(dtype), mask=mask)
    tl.store(p + 2 * BC, X2.to(dtype), mask=mask)
    tl.store(p + 3 * BC, X3.to(dtype), mask=mask)


@triton.jit
def store_below(ptr, X10, X20, X21, X30, X31, X32, t0, n, h, H, C: tl.constexpr, BC: tl.constexpr):
    """The six blocks ``(b, c)``, c < b, of a chunk matrix."""
    store_block(ptr, X10, t0, n, 1, 0, h, H, C, BC)
    store_block(ptr, X20, t0, n, 2, 0, h, H, C, BC)
    store_block(ptr, X21, t0, n, 2, 1, h, H, C, BC)
    store_block(ptr, X30, t0, n, 3, 0, h, H, C, BC)
    store_block(ptr, X31, t0, n, 3, 1, h, H, C, BC)
    store_block(ptr, X32, t0, n, 3, 2, h, H, C, BC)


@triton.jit
def store_zeros_right(ptr, t0, n, s, h, H, C: tl.constexpr, BC: tl.constexpr):
    """Zeros into sub-chunk s's rows right of its diagonal block (the blocks above the diagonal)."""
    p, mask = block_ptrs(ptr, t0, n, s, 0, h, H, C, BC)
    zero = tl.zeros((BC, BC), ptr.dtype.element_ty)
    for c in range(s + 1, C // BC):
        tl.store(p + c * BC, zero, mask=mask)


@triton.jit
def block_beta(beta_ptr, t0, n, s, h, H, BC: tl.constexpr):
    """beta of sub-chunk s's rows as a column ``[BC, 1]`` (zero past the chunk's end)."""
    _, rows, live, _ = sub_rows(t0, n, s, BC)
    return load_rowvec(beta_ptr, rows, live, h, H)[:, None]
