"""Intra-chunk algebra of chunked KDA's backward (and GLA's pair sums): decayed sums over sub-chunks.

A chunk has C = 64 rows (tokens) i, cut into sub-chunks of BC = 16. ``G [C, BK]`` is the chunk-local
cumulative log-decay (fp32; rows past the end of a partial chunk repeat the last valid row, so they
decay nothing). Every kernel of the KDA chunk form reduces to three decayed sums over pairs j <= i:

    pairs:    M_ij = sum_d X_id Y_jd exp(G_id - G_jd)        [C, C]  (forward: Akk, Aqk; GLA's P)
    rowform:  R_id = sum_j M_ij Y_jd exp(G_id - G_jd)        [C, BK] (backward, i side)
    colform:  Q_jd = sum_i M_ij X_id exp(G_id - G_jd)        [C, BK] (backward, j side)

``exp(G_i - G_j)`` must never be formed as ``exp(G_i) * exp(-G_j)``: with strong decays the second
factor overflows. Pairs are split by where i and j sit:

* different sub-chunks, two tensor-core levels. Level S (32, then 16) takes i in an odd S-block and j
  in the even S-block just before it, and a reference row r = the first row of i's block:
  ``exp(G_i - G_r) * exp(G_r - G_j)``. With ``g <= 0`` both factors lie in (0, 1] (r <= i, j < r), so
  nothing overflows, whatever the decay. One masked ``[C, BK] x [BK, C]`` dot per level and operand.
* the same sub-chunk (diagonal 16x16 blocks), two ways:
  - dots against the block's middle row m = 16*b + 8: ``exp(G_i - G_m) * exp(G_m - G_j)``. Where
    the span ``|G_i - G_m| <= 40`` for every row and channel of the tile, both factors stay below
    e^40 = 2.4e17 and each product ``= exp(G_i - G_j) <= 1`` (j <= i) keeps fp32 (and tf32)
    relative accuracy; the entries j > i that the mask drops are at most e^80 |X||Y|, finite in fp32
    for the unit-scale operands of KDA (and dropped by ``tl.where`` even when not). These dots run at
    ``DPREC`` (``diag_precision``).
  - exactly, every factor ``exp(G_i - G_j)`` formed on its own, for any decay: for the chunks the forward's
    checked pass flagged (``chunk_fwd.intra``: a sub-chunk's span above ``DIAG_SPAN``), a source row at a time
    in a kernel of their own (``diag_source_row``, ``chunk_bwd.grads_diag_kernel``), which the row and column
    forms here leave those blocks to.
  The ``SAFE`` path (``lower_bound <= g <= 0``, lower_bound >= -5) always takes the dots: there
  ``G_i - G_m <= 8 |lb| <= 40`` (i < m) and ``G_m - G_j <= 7 |lb| <= 35`` (j > m).

Rows are read at other rows (the reference rows) with ``tl.gather`` on the registers (``USE_GATHER``) or,
the fallback, by loading them again from memory (``take_rows``).

Here every sum is taken on whole ``[C, C]`` and ``[C, BK]`` tiles, the pairs a level or the diagonal does
not own masked off. KDA's forward takes the pairs by sub-chunk blocks instead (``blocks``: no masked-off
product is computed, and the inverse is solved block by block), with the same split of the exponent and the
same flagged chunks' exact rows (``chunk_fwd.diag_rows_kernel``). Not kept: levels inside the sub-chunks (8, 4,
2, 1 rows), on whole ``[C, C]`` tiles at "tf32x3", took the backward under strong decay from 12.1 to 21.3 ms
(B=8, T=4096, H100) and made the row and column kernels spill 936 and 1600 B a thread (32 and 0 with the exact
sum); the exact sum as ``[BC, BC, BK]`` tiles in the row and column kernels, a sub-chunk at a time, took the row
kernel from 3.26 to 7.03 ms under strong decay and both kernels 0.03-0.07 ms slower at normal decay
(``benchmarks/results/kda_kernels_h100_session13_exact_tiles_not_kept.txt``). The exact sum that the row and
column kernels took before, a column of every block per step (16 steps, in a branch of each kernel), is replaced
by the kernel of its own (``docs/performance.md``, thirteenth session).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..chunk.tiles import decay


@triton.jit
def take_rows(tile, ptr, stride, rows, cols, cmask, n, CLAMP: tl.constexpr, USE_GATHER: tl.constexpr):
    """``tile[rows[i], :]`` for a chunk tile ``[C, BK]`` read from ``ptr + row*stride + cols``.

    rows [C] are chunk rows in [0, C). Rows >= n (past the end of a partial chunk) are the last
    valid row when ``CLAMP`` (the convention for G) and zero otherwise, as the tile itself holds them.
    """
    if USE_GATHER:
        out = tl.gather(tile, rows[:, None] + 0 * cols[None, :], axis=0)
    else:
        if CLAMP:
            r = tl.minimum(rows, n - 1)
            mask = cmask[None, :] & (r >= 0)[:, None]
        else:
            r = rows
            mask = cmask[None, :] & (r < n)[:, None]
        out = tl.load(ptr + r.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tile.dtype)
    return out


@triton.jit
def level_rows(S: tl.constexpr, C: tl.constexpr):
    """For level S: whether each row is in an odd S-block (an "i" row), and its reference row
    (its own block's first row if odd, the next block's first row if even)."""
    i = tl.arange(0, C)
    blk = i // S
    odd = (blk % 2) == 1
    ref = tl.where(odd, blk * S, (blk + 1) * S)
    return odd, ref


@triton.jit
def level_pairs(S: tl.constexpr, C: tl.constexpr):
    """[C, C] mask of the pairs level S handles: i in an odd S-block, j in the block just before."""
    i = tl.arange(0, C)[:, None]
    j = tl.arange(0, C)[None, :]
    return ((i // S) % 2 == 1) & (j // S == i // S - 1)


@triton.jit
def level_factors(G, G_ptr, stride, cols, cmask, n, S: tl.constexpr, C: tl.constexpr, USE_GATHER: tl.constexpr):
    """``(odd, e)``: e = exp(G - G_ref) on odd-block rows, exp(G_ref - G) on even-block rows (<= 1)."""
    odd, ref = level_rows(S, C)
    G_ref = take_rows(G, G_ptr, stride, ref, cols, cmask, n, True, USE_GATHER)
    return odd, decay(tl.where(odd[:, None], G - G_ref, G_ref - G))


DIAG_SPAN = tl.constexpr(40.0)  # the largest |G_i - G_m| inside a sub-chunk for which the diagonal blocks take dots


@triton.jit
def diag_factors(G, G_ptr, stride, cols, cmask, n, C: tl.constexpr, BC: tl.constexpr, USE_GATHER: tl.constexpr):
    """``(exp(G - G_m), exp(G_m - G), dots)`` with m the middle row of each row's sub-chunk; ``dots``:
    whether the span ``max |G - G_m|`` of the tile allows the diagonal blocks' dots (<= DIAG_SPAN)."""
    mid = (tl.arange(0, C) // BC) * BC + BC // 2
    d = G - take_rows(G, G_ptr, stride, mid, cols, cmask, n, True, USE_GATHER)
    return decay(d), decay(-d), tl.max(tl.abs(d)) <= DIAG_SPAN


@triton.jit
def same_block(C: tl.constexpr, BC: tl.constexpr):
    i = tl.arange(0, C)[:, None]
    j = tl.arange(0, C)[None, :]
    return (i // BC) == (j // BC)


def diag_precision(precision: str) -> str:
    """Precision of the dots inside diagonal sub-chunk blocks (``DPREC``): the SAFE path's pair sums
    and the doubling steps of ``unit_lower_inverse``. Under strong decay those blocks carry most of
    the weight of every pair sum, so "tf32" is raised to "tf32x3" there (the general path sums the
    pairs exactly in fp32). Measured: it brings safe_gate's tf32 errors down to the
    general path's (o 1.8e-3 -> 1.1e-3, dg 4.2e-3 -> 1.1e-3, fp32 inputs, lower_bound -5)."""
    return "tf32x3" if precision == "tf32" else precision


@triton.jit
def expand_band(band, C: tl.constexpr, BC: tl.constexpr):
    """``[C, BC] -> [C, C]``: entry (i, j) is ``band[i, j % BC]`` (mask it to the diagonal blocks)."""
    return tl.reshape(tl.broadcast_to(band[:, None, :], (C, C // BC, BC)), (C, C))


# ------------------------------------------------------------------------------- row/column forms
# The backward's coefficient matrices (dL, dP: ``[C, C]`` per chunk, lower triangular) in registers, for the
# tensor-core levels and the diagonal dots.


@triton.jit
def chunk_rowform(M1, M2, y, G, G_ptr, stride, cols, cmask, n, diag, C: tl.constexpr, BC: tl.constexpr,
                  USE_GATHER: tl.constexpr, PREC: tl.constexpr, DPREC: tl.constexpr):
    """``(R1, R2)``, ``Rm_id = sum_{j <= i} Mm_ij y_jd e^{G_id - G_jd}`` for M1 = dL, M2 = dP; the diagonal
    blocks' pairs by dots where ``diag``, else left out (``diag_source_row``)."""
    R1 = tl.zeros(y.shape, tl.float32)
    R2 = tl.zeros(y.shape, tl.float32)
    for lvl in tl.static_range(2):
        odd, e = level_factors(G, G_ptr, stride, cols, cmask, n, 32 >> lvl, C, USE_GATHER)
        valid = level_pairs(32 >> lvl, C)
        right = tl.where(odd[:, None], 0.0, y * e)
        left = tl.where(odd[:, None], e, 0.0)
        R1 += left * tl.dot(tl.where(valid, M1, 0.0), right, input_precision=PREC)
        R2 += left * tl.dot(tl.where(valid, M2, 0.0), right, input_precision=PREC)
    if diag:
        el, er, _ = diag_factors(G, G_ptr, stride, cols, cmask, n, C, BC, USE_GATHER)
        same = same_block(C, BC)
        right = y * er
        R1 += el * tl.dot(tl.where(same, M1, 0.0), right, input_precision=DPREC)
        R2 += el * tl.dot(tl.where(same, M2, 0.0), right, input_precision=DPREC)
    return R1, R2


@triton.jit
def chunk_colform(M1, x1, M2, x2, G, G_ptr, stride, cols, cmask, n, diag, C: tl.constexpr, BC: tl.constexpr,
                  USE_GATHER: tl.constexpr, PREC: tl.constexpr, DPREC: tl.constexpr):
    """``Q_jd = sum_{i >= j} (M1_ij x1_id + M2_ij x2_id) e^{G_id - G_jd}`` for M1 = Diag(beta) dL,
    M2 = scale dP; the diagonal blocks' pairs by dots where ``diag``, else left out (``diag_source_row``)."""
    Q = tl.zeros(x1.shape, tl.float32)
    for lvl in tl.static_range(2):
        odd, e = level_factors(G, G_ptr, stride, cols, cmask, n, 32 >> lvl, C, USE_GATHER)
        valid = level_pairs(32 >> lvl, C)
        acc = tl.dot(tl.trans(tl.where(valid, M1, 0.0)), tl.where(odd[:, None], x1 * e, 0.0), input_precision=PREC)
        acc += tl.dot(tl.trans(tl.where(valid, M2, 0.0)), tl.where(odd[:, None], x2 * e, 0.0), input_precision=PREC)
        Q += tl.where(odd[:, None], 0.0, e) * acc
    if diag:
        el, er, _ = diag_factors(G, G_ptr, stride, cols, cmask, n, C, BC, USE_GATHER)
        same = same_block(C, BC)
        acc = tl.dot(tl.trans(tl.where(same, M1, 0.0)), x1 * el, input_precision=DPREC)
        acc += tl.dot(tl.trans(tl.where(same, M2, 0.0)), x2 * el, input_precision=DPREC)
        Q += er * acc
    return Q


@triton.jit
def diag_source_row(G, i, j, k_j, q_j, G_j, dL_ij, dP_ij, m1_ji, m2_ji):
    """What the sub-chunk's row j gives its rows i ``[BC]`` (their ``G [BC, BK]``) in the row and column forms,
    exactly for any decay, each factor ``e^{+-(G_id - G_jd)}`` formed on its own:

        R1_i += dL_ij k_j e^{G_i - G_j}  (i >= j),    R2_i += the same with dP_ij
        Q_i  += (m1_ji k_j + m2_ji q_j) e^{G_j - G_i}  (i <= j)

    from row j's ``k_j``, ``q_j``, ``G_j`` ``[BK]``, column j of dL and dP (``dL_ij``, ``dP_ij`` ``[BC]``) and row j
    of ``Diag(beta) dL`` and ``scale dP`` (``m1_ji``, ``m2_ji`` ``[BC]``). One exponential an entry serves both forms:
    the exponent is ``G_i - G_j`` where i >= j, ``G_j - G_i`` elsewhere. Returns the three ``[BC, BK]`` terms."""
    after = (i >= j)[:, None]
    e = decay(tl.where(after, G - G_j[None, :], G_j[None, :] - G))
    ke = tl.where(after, k_j[None, :] * e, 0.0)
    col = (i <= j)[:, None]
    return (dL_ij[:, None] * ke, dP_ij[:, None] * ke,
            tl.where(col, (m1_ji[:, None] * k_j[None, :] + m2_ji[:, None] * q_j[None, :]) * e, 0.0))
