"""Decayed pair sums of chunked GLA with a gate per key channel, without overflow.

A chunk has C rows (tokens, C = 64 or 128) cut into sub-chunks of BC = 16; ``G [C, BK]`` is the
chunk-local cumulative log-decay of one channel block (fp32, rows past the end of a partial chunk
repeat the last valid row). The chunk form of GLA needs three sums over pairs j <= i:

    gram:     P_ij = sum_d X_id Y_jd exp(G_id - G_jd)          [C, C]   (forward: Aqk)
    rowform:  R_id = sum_{j <= i} M_ij Y_jd exp(G_id - G_jd)   [C, BK]  (backward: dq)
    colform:  Q_jd = sum_{i >= j} M_ij X_id exp(G_id - G_jd)   [C, BK]  (backward: dk)

``exp(G_i - G_j)`` is never formed as ``exp(G_i) exp(-G_j)``. The pairs are split as in KDA's
``kda.subchunk`` (whose building blocks these functions use): pairs in different sub-chunks take one
tensor-core dot per level S = C/2, ..., 16 through a reference row r (``exp(G_i - G_r) exp(G_r - G_j)``,
both factors in (0, 1]); pairs inside a sub-chunk take dots against its middle row where the tile's
span ``max |G - G_m|`` is at most ``DIAG_SPAN`` and an exact elementwise sum (one column per step)
elsewhere. KDA needs these sums for two matrices at once and weighted by beta; GLA for one.

Pointers ``x_ptr``, ``G_ptr`` address row 0 of the chunk (``cols`` added), consecutive rows
``xstride`` and ``gstride`` elements apart: the exact steps read rows there (``take_rows``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..chunk.tiles import decay
from ..kda.subchunk import diag_factors, expand_band, level_factors, level_pairs, same_block, take_rows


@triton.jit
def gram(P, x, y, G, y_ptr, ystride, G_ptr, gstride, cols, cmask, n, C: tl.constexpr, BC: tl.constexpr,
         PREC: tl.constexpr, DPREC: tl.constexpr):
    """``P += sum_d x_id y_jd exp(G_id - G_jd)`` for j <= i (0 above the diagonal)."""
    for lvl in tl.static_range(3):
        if ((C // 2) >> lvl) >= BC:
            odd, e = level_factors(G, G_ptr, gstride, cols, cmask, n, (C // 2) >> lvl, C, False)
            right = tl.trans(tl.where(odd[:, None], 0.0, y * e))
            P += tl.where(level_pairs((C // 2) >> lvl, C),
                          tl.dot(tl.where(odd[:, None], x * e, 0.0), right, input_precision=PREC), 0.0)
    el, er, dots = diag_factors(G, G_ptr, gstride, cols, cmask, n, C, BC, False)
    i = tl.arange(0, C)
    lower = same_block(C, BC) & (i[:, None] >= i[None, :])
    if dots:
        P += tl.where(lower, tl.dot(x * el, tl.trans(y * er), input_precision=DPREC), 0.0)
    else:
        start = (i // BC) * BC
        band_r = tl.arange(0, BC)[None, :]
        band = tl.zeros((C, BC), tl.float32)
        for r in range(BC):
            jr = start + r
            y_r = take_rows(y, y_ptr, ystride, jr, cols, cmask, n, False, False)
            G_r = take_rows(G, G_ptr, gstride, jr, cols, cmask, n, True, False)
            ye = y_r * decay(tl.where((i >= jr)[:, None], G - G_r, float("-inf")))
            band += tl.where(band_r == r, tl.sum(x * ye, axis=1)[:, None], 0.0)
        P += tl.where(lower, expand_band(band, C, BC), 0.0)
    return P


@triton.jit
def rowform(M, y, G, y_ptr, ystride, G_ptr, gstride, cols, cmask, n, C: tl.constexpr, BC: tl.constexpr,
            PREC: tl.constexpr, DPREC: tl.constexpr):
    """``R_id = sum_{j <= i} M_ij y_jd exp(G_id - G_jd)`` for a lower triangular ``M [C, C]``."""
    R = tl.zeros(y.shape, tl.float32)
    for lvl in tl.static_range(3):
        if ((C // 2) >> lvl) >= BC:
            odd, e = level_factors(G, G_ptr, gstride, cols, cmask, n, (C // 2) >> lvl, C, False)
            inner = tl.dot(tl.where(level_pairs((C // 2) >> lvl, C), M, 0.0), tl.where(odd[:, None], 0.0, y * e),
                           input_precision=PREC)
            R += tl.where(odd[:, None], e, 0.0) * inner
    el, er, dots = diag_factors(G, G_ptr, gstride, cols, cmask, n, C, BC, False)
    same = same_block(C, BC)
    if dots:
        R += el * tl.dot(tl.where(same, M, 0.0), y * er, input_precision=DPREC)
    else:
        i = tl.arange(0, C)
        start = (i // BC) * BC
        for r in range(BC):
            jr = start + r
            y_r = take_rows(y, y_ptr, ystride, jr, cols, cmask, n, False, False)
            G_r = take_rows(G, G_ptr, gstride, jr, cols, cmask, n, True, False)
            m = tl.sum(tl.where(i[None, :] == jr[:, None], M, 0.0), axis=1)  # M[i, jr]
            R += m[:, None] * y_r * decay(tl.where((i >= jr)[:, None], G - G_r, float("-inf")))
    return R


@triton.jit
def colform(M, x, G, x_ptr, xstride, G_ptr, gstride, cols, cmask, n, C: tl.constexpr, BC: tl.constexpr,
            PREC: tl.constexpr, DPREC: tl.constexpr):
    """``Q_jd = sum_{i >= j} M_ij x_id exp(G_id - G_jd)`` for a lower triangular ``M [C, C]``."""
    Q = tl.zeros(x.shape, tl.float32)
    for lvl in tl.static_range(3):
        if ((C // 2) >> lvl) >= BC:
            odd, e = level_factors(G, G_ptr, gstride, cols, cmask, n, (C // 2) >> lvl, C, False)
            inner = tl.dot(tl.trans(tl.where(level_pairs((C // 2) >> lvl, C), M, 0.0)),
                           tl.where(odd[:, None], x * e, 0.0), input_precision=PREC)
            Q += tl.where(odd[:, None], 0.0, e) * inner
    el, er, dots = diag_factors(G, G_ptr, gstride, cols, cmask, n, C, BC, False)
    same = same_block(C, BC)
    if dots:
        Q += er * tl.dot(tl.trans(tl.where(same, M, 0.0)), x * el, input_precision=DPREC)
    else:
        i = tl.arange(0, C)
        start = (i // BC) * BC
        for r in range(BC):
            ir = start + r
            x_r = take_rows(x, x_ptr, xstride, ir, cols, cmask, n, False, False)
            G_r = take_rows(G, G_ptr, gstride, ir, cols, cmask, n, True, False)
            m = tl.sum(tl.where(i[:, None] == ir[None, :], M, 0.0), axis=0)  # M[ir, i]
            Q += m[:, None] * x_r * decay(tl.where((ir >= i)[:, None], G_r - G, float("-inf")))
    return Q
