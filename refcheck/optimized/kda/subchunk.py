"""Intra-chunk algebra of chunked KDA's backward (and GLA's pair sums): decayed sums over sub-chunks.

A chunk has C = 64 rows (tokens) i, cut into sub-chunks of BC = 16. ``G [C, BK]`` is the chunk-local
cumulative log-decay (fp32; rows past the end of a partial chunk repeat the last valid row, so they
decay nothing). Every kernel of the KDA chunk form reduces to three decayed sums over pairs j <= i:

    pairs:    M_ij = sum_d X_id Y_jd exp(G_id - G_jd)        [C, C]  (forward: Akk, Aqk; GLA's P)
    rowform:  R_id = sum_j M_ij Y_jd exp(G_id - G_jd)        [C, BK] (backward, i side)
    colform:  Q_jd = sum_i M_ij X_id exp(G_id - G_jd)        [C, BK] (backward, j side)

``exp(G_i - G_j)`` must never be formed as ``exp(G_i) * exp(-G_j)``: with strong decays the second
factor overflows. Pairs are split by where i and j sit:

* different sub-chunks, by dots against a reference row r between them: ``exp(G_i - G_r) * exp(G_r - G_j)``
  with j < r <= i, both factors in (0, 1] (``g <= 0``), so nothing overflows, whatever the decay. On whole
  ``[C, C]`` tiles (GLA's ``gla.pairs``) in two tensor-core levels: level S (32, then 16) takes i in an odd
  S-block and j in the even S-block just before it, r the first row of i's block, one masked
  ``[C, BK] x [BK, C]`` dot per level and operand (``level_factors``, ``level_pairs``). KDA's backward takes
  them a sub-chunk s at a time (``sub_rowform``, ``sub_colform``): r the first row of s for the sub-chunks
  before it (row form), its last row for those after it (column form), one ``[BC, BC] x [BC, BK]`` dot per
  sub-chunk pair and operand, no product masked off.
* the same sub-chunk (diagonal 16x16 blocks), two ways:
  - dots against the block's middle row m = 16*b + 8: ``exp(G_i - G_m) * exp(G_m - G_j)``. Where
    the span ``|G_i - G_m| <= 40`` for every row and channel of the tile, both factors stay below
    e^40 = 2.4e17 and each product ``= exp(G_i - G_j) <= 1`` (j <= i) keeps fp32 (and tf32)
    relative accuracy; the entries j > i that the mask drops are at most e^80 |X||Y|, finite in fp32
    for the unit-scale operands of KDA (and dropped by ``tl.where`` even when not). These dots run at
    ``DPREC`` (``diag_precision``; ``diag_factors``, ``sub_diag``).
  - exactly, every factor ``exp(G_i - G_j)`` formed on its own, for any decay: for the chunks the forward
    flagged (``chunk_fwd.intra``: a sub-chunk's span above ``DIAG_SPAN``), a source row at a time
    in a kernel of their own (``diag_source_row``, ``chunk_bwd.grads_diag_kernel``), which the backward's pair
    sums leave those blocks to.
  The ``SAFE`` path (``lower_bound <= g <= 0``, lower_bound >= -5) always takes the dots: there
  ``G_i - G_m <= 8 |lb| <= 40`` (i < m) and ``G_m - G_j <= 7 |lb| <= 35`` (j > m).

Rows are read at other rows (the reference rows) with ``tl.gather`` on the registers (``USE_GATHER``) or,
the fallback, by loading them again from memory (``take_rows``).

KDA's forward takes the pairs by sub-chunk blocks too (``blocks``: the inverse is solved block by block), with
the same split of the exponent and the flagged sub-chunks' exact rows (``chunk_fwd.exact_kernel``). The
backward takes them a sub-chunk at a time too (``chunk_bwd.grads_pairs_kernel``): on whole ``[C, C]`` tiles, in a
row kernel and a column kernel at 255 registers, they took 3.447 ms where it takes 2.526 (H200, bf16, B=8, T=4096,
H=16, K=128, at 0ae2b67; ``docs/kernels/kda.md``). Not kept: levels inside the sub-chunks (8, 4,
2, 1 rows), on whole ``[C, C]`` tiles at "tf32x3", took the backward under strong decay from 12.1 to 21.3 ms
(B=8, T=4096, H100) and made the row and column kernels spill 936 and 1600 B a thread (32 and 0 with the exact
sum); the exact sum as ``[BC, BC, BK]`` tiles in the row and column kernels, a sub-chunk at a time, took the row
kernel from 3.26 to 7.03 ms under strong decay and both kernels 0.03-0.07 ms slower at normal decay (H100, at
5f11193); the exact sum inside ``grads_pairs_kernel`` took it to 3.281 ms at normal decay and 4.402 under strong decay
against 2.179 + 1.708 with ``grads_diag_kernel`` (H200, at 0ae2b67).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..chunk.tiles import decay, load_gate, load_rowvec, load_tile, tf32_nearest


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


def diag_precision(precision: str, inputs: torch.dtype = torch.float32) -> str:
    """Precision of the dots inside diagonal sub-chunk blocks (``DPREC``): the pair sums against the middle row
    and the doubling steps of ``blocks.unit_inverse``. Under strong decay those blocks carry most of
    the weight of every pair sum, so for fp32 ``inputs`` "tf32" is raised to "tf32x3" there. Measured: it brings
    safe_gate's tf32 errors down to the general path's (o 1.8e-3 -> 1.1e-3, dg 4.2e-3 -> 1.1e-3, fp32 inputs,
    lower_bound -5). For bf16 inputs, whose rounding (2^-9) dominates, "tf32" stays, its operands rounded to nearest
    (``tiles.tf32_nearest``; a "tf32" dot truncates them). Measured in the faithful interpreter (KDA forward and
    backward, B=1, T=256, H=2, K=V=128, use_qk_l2norm, log-decays down to -5), errors against float64 at "tf32x3" /
    "tf32" truncating / "tf32" rounded to nearest: bf16 o 2.36e-3 / 2.53e-3 / 2.39e-3, dq 2.39e-3 / 2.60e-3 / 2.42e-3,
    dg 1.95e-3 / 2.00e-3 / 1.99e-3, the others within 1%; fp16 (rounded to 2^-11 as "tf32" is) o 5.9e-4 -> 6.9e-4 and
    dg 5.2e-4 -> 6.3e-4 rounded to nearest, so fp16 keeps "tf32x3". GLA's calls keep the fp32 rule (``inputs`` left
    out)."""
    if precision != "tf32":
        return precision
    return "tf32" if inputs == torch.bfloat16 else "tf32x3"


@triton.jit
def expand_band(band, C: tl.constexpr, BC: tl.constexpr):
    """``[C, BC] -> [C, C]``: entry (i, j) is ``band[i, j % BC]`` (mask it to the diagonal blocks)."""
    return tl.reshape(tl.broadcast_to(band[:, None, :], (C, C // BC, BC)), (C, C))


# ------------------------------------------------------------------------------- row/column forms
# KDA's backward, a sub-chunk s of BC rows at a time (``chunk_bwd.grads_pairs_kernel``): ``[BC, BK]`` tiles of q, k
# and G and ``[BC, BC]`` blocks of the coefficient matrices (dL, dP: ``[T, H, C]`` fp32, lower triangular, zeros
# above the diagonal) read from memory as a pair of sub-chunks needs them, as FLA's intra-chunk backward does: no
# masked-off product is formed, and the tiles are small enough for several programs an SM.


@triton.jit
def sub_rows(t0, n, s, BC: tl.constexpr):
    """Sub-chunk s of a chunk of n valid rows from token t0: ``(i, rows, live, grows)``, its chunk rows, token rows,
    which are valid, and token rows clamped to the last valid one (for G)."""
    i = s * BC + tl.arange(0, BC)
    return i, t0 + i, i < n, t0 + tl.minimum(i, n - 1)


@triton.jit
def sub_ref(G, G_ptr, t0, n, s, h, H, K, cols, cmask, r: tl.constexpr, BC: tl.constexpr, USE_GATHER: tl.constexpr):
    """Row r of sub-chunk s's G tile (clamped to the chunk's last valid row, as the tile holds it), on every row
    ``[BC, BK]`` (``take_rows``)."""
    return take_rows(G, G_ptr + ((t0 + s * BC).to(tl.int64) * H + h) * K, H * K, tl.full((BC,), r, tl.int32), cols,
                     cmask, n - s * BC, True, USE_GATHER)


@triton.jit
def sub_rowform(dL_ptr, dP_ptr, k_ptr, G_ptr, G, t0, n, s, h, H, K, cols, cmask, C: tl.constexpr, BC: tl.constexpr,
                USE_GATHER: tl.constexpr, PREC: tl.constexpr):
    """``(R1, R2)`` ``[BC, BK]`` for the rows i of sub-chunk s (G its tile), the pairs with j in the sub-chunks before
    it: ``Rm_i = sum_j Mm_ij k_j e^{G_i - G_j}``, M1 = dL, M2 = dP, against s's first row r,
    ``e^{G_i - G_r} (M_sa (k_a e^{G_r - G_a}))`` (both factors <= 1: j < r <= i), one dot per sub-chunk a and M."""
    _, rows, live, _ = sub_rows(t0, n, s, BC)
    R1 = tl.zeros(G.shape, tl.float32)
    R2 = tl.zeros(G.shape, tl.float32)
    if s > 0:
        G_r = sub_ref(G, G_ptr, t0, n, s, h, H, K, cols, cmask, 0, BC, USE_GATHER)
        for a in range(s):
            j, jrows, jlive, _ = sub_rows(t0, n, a, BC)
            ke = load_tile(k_ptr, jrows, jlive, h, H, K, cols, cmask) * decay(
                G_r - load_gate(G_ptr, jrows, jlive, h, H, K, cols, cmask))
            R1 = tl.dot(load_tile(dL_ptr, rows, live, h, H, C, j, j < C), ke, R1, input_precision=PREC)
            R2 = tl.dot(load_tile(dP_ptr, rows, live, h, H, C, j, j < C), ke, R2, input_precision=PREC)
        e = decay(G - G_r)
        R1 *= e
        R2 *= e
    return R1, R2


@triton.jit
def sub_colform(dL_ptr, dP_ptr, q_ptr, k_ptr, G_ptr, beta_ptr, G, t0, n, s, scale, h, H, K, cols, cmask,
                C: tl.constexpr, BC: tl.constexpr, USE_GATHER: tl.constexpr, PREC: tl.constexpr):
    """``Q`` ``[BC, BK]`` for the rows j of sub-chunk s (G its tile), the pairs with i in the sub-chunks after it:
    ``Q_j = sum_i (beta_i dL_ij k_i + scale dP_ij q_i) e^{G_i - G_j}``, against s's last row r,
    ``e^{G_r - G_j} (dL_as^T (beta k e^{G_i - G_r})_a + ...)`` (both factors <= 1: j <= r < i)."""
    j, _, _, _ = sub_rows(t0, n, s, BC)
    Q = tl.zeros(G.shape, tl.float32)
    nsub = tl.cdiv(n, BC)
    if s < nsub - 1:
        G_r = sub_ref(G, G_ptr, t0, n, s, h, H, K, cols, cmask, BC - 1, BC, USE_GATHER)
        for a in range(s + 1, nsub):
            _, irows, ilive, igrows = sub_rows(t0, n, a, BC)
            e = decay(load_gate(G_ptr, igrows, igrows >= 0, h, H, K, cols, cmask) - G_r)
            x1 = load_tile(k_ptr, irows, ilive, h, H, K, cols, cmask) * (load_rowvec(beta_ptr, irows, ilive, h, H)[:, None] * e)
            x2 = load_tile(q_ptr, irows, ilive, h, H, K, cols, cmask) * (scale * e)
            Q = tl.dot(tl.trans(load_tile(dL_ptr, irows, ilive, h, H, C, j, j < C)), x1, Q, input_precision=PREC)
            Q = tl.dot(tl.trans(load_tile(dP_ptr, irows, ilive, h, H, C, j, j < C)), x2, Q, input_precision=PREC)
        Q *= decay(G_r - G)
    return Q


@triton.jit
def sub_diag(dL_ptr, dP_ptr, k, x1, x2, G, G_ptr, t0, n, s, h, H, K, cols, cmask, diag, C: tl.constexpr,
             BC: tl.constexpr, USE_GATHER: tl.constexpr, DPREC: tl.constexpr):
    """The diagonal block's shares ``(R1, R2, Q)`` of sub-chunk s (``sub_rowform``'s and ``sub_colform``'s pairs with i
    and j both in s; x1 = beta k, x2 = scale q of its rows) by dots against its middle row m:
    ``e^{G_i - G_m} (M (k e^{G_m - G}))_i`` and ``e^{G_m - G_j} (M^T (x e^{G - G_m}))_j``, where the decay inside the
    sub-chunk allows them (``diag``, ``DIAG_SPAN``); zeros elsewhere (the blocks and the exponents taken as zeros, so
    that nothing overflows: the dots run either way, without a branch)."""
    i, rows, live, _ = sub_rows(t0, n, s, BC)
    d = tl.where(diag, G - sub_ref(G, G_ptr, t0, n, s, h, H, K, cols, cmask, BC // 2, BC, USE_GATHER), 0.0)
    el = decay(d)
    er = decay(-d)
    M1 = tf32_nearest(load_tile(dL_ptr, rows, live & diag, h, H, C, i, i < C), DPREC)
    M2 = tf32_nearest(load_tile(dP_ptr, rows, live & diag, h, H, C, i, i < C), DPREC)
    ke = tf32_nearest(k * er, DPREC)
    Q = tl.dot(tl.trans(M1), tf32_nearest(x1 * el, DPREC), input_precision=DPREC)
    Q = tl.dot(tl.trans(M2), tf32_nearest(x2 * el, DPREC), Q, input_precision=DPREC)
    return (el * tl.dot(M1, ke, input_precision=DPREC), el * tl.dot(M2, ke, input_precision=DPREC), er * Q)


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
