"""Attention backward from the forward's lse (FlashAttention-2), deterministic (no atomics).

Per sequence and query head, with ``P_ij = exp(scale q_i . k_j - lse_i)`` (0 where query i does not
see key j) recomputed blockwise, the cotangents dO ``[T, Dv]`` and dlse ``[T]``:

    delta_i = dO_i . o_i - dlse_i                              (``preprocess_kernel``)
    dV_j   += sum_i P_ij dO_i                                  (summed over the G query heads of k/v head)
    dS_ij   = P_ij (dO_i . v_j - delta_i)
    dQ_i    = scale sum_j dS_ij k_j                            (``dq_kernel``: a query block walks its keys)
    dK_j   += scale sum_i dS_ij q_i                            (``dkdv_kernel``: a key block walks its queries)

(``lse`` enters o only through the softmax normaliser: ``d lse_i / d s_ij = P_ij``, hence the
``- dlse_i`` in delta.) P and dS are rounded to the input dtype before their dots, as in the forward.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import KERNEL_LOG2E, launch, tma_aligned
from .layout import Layout
from .tiles import (
    block_descriptors,
    dot_split,
    key_blocks,
    load_block,
    load_split,
    load_tile,
    query_block,
    query_blocks,
    row_offset,
    sequence,
    softcapped,
    store_tile,
    visible,
    zeros_split,
)

PREPROCESS_BM = 64
"""Query rows per ``preprocess_kernel`` program."""
DQ_BM = 128
"""Query rows per ``dq_kernel`` program, halved (twice) where the GPU's shared memory does not hold them (fp32
MLA with precision "ieee" needed 344 KB at every launch setting of 128 rows on an H100; fp32 at head dims
256 with "tf32x3" 294912 B at the last of 64 rows, offline for sm_90)."""


def dq_keys(lay: Layout) -> int:
    """The key block a ``dq_kernel`` program walks: 64 for 16-bit inputs (on an H100, bf16, B=8 T=2048
    H=16: 0.15 to 0.2 ms less of the whole backward than 32), 32 for fp32."""
    return 32 if lay.itemsize > 2 else 64


def dkdv_blocks(lay: Layout) -> tuple[int, int]:
    """``(BN, BM)``: the keys of a ``dkdv_kernel`` program and the query block it walks. 16-bit inputs: 128
    keys walking 64 queries up to MLA's width (128 + 64 + 128). Measured on an H100 (bf16, B=8 T=2048 H=16,
    eight warps, three stages; ``benchmarks/attention_sweep.py``, ``results/attention_sweep_h100.json``)
    against 64 walking 32 for MLA and 128 walking 32 for Dqk = Dv = 128: the whole backward of MLA
    5.90 -> 2.79 ms (causal 3.21 -> 1.81), of 128/128 2.70 -> 2.48 ms. fp32 and wider tiles: the largest
    blocks whose fp32 dK, dV ``[BN, width]`` compile without spills on sm_90 under Triton 3.6 at eight
    warps (``kernel_resources.py``, not timed): 128 up to width 256, 64 up to 320, else 32, walking 32."""
    if lay.itemsize <= 2 and lay.width <= 320:
        return 128, 64
    return (128 if lay.width <= 256 else 64 if lay.width <= 320 else 32), 32


@triton.jit
def preprocess_kernel(o_ptr, do_ptr, dlse_ptr, delta_ptr, cuq_ptr, cuk_ptr, H, T, DV: tl.constexpr,
                      BATCHED: tl.constexpr, HAS_DLSE: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr,
                      PREC: tl.constexpr):
    """``delta`` of query block ``program_id(0)`` of sequence ``program_id(1)``, head ``program_id(2)``."""
    n = tl.program_id(1)
    h = tl.program_id(2)
    qs, Tq, _, _ = sequence(n, cuq_ptr, cuk_ptr)
    m0 = tl.program_id(0) * BM
    i = m0 + tl.arange(0, BM)
    imask = i < Tq
    o = load_tile(o_ptr, qs + m0, Tq - m0, h, H, DV, 0, BM, BDV)
    do = load_tile(do_ptr, qs + m0, Tq - m0, h, H, DV, 0, BM, BDV)
    # do_i . o_i by the dot that computes dP_ij = do_i . v_j (the diagonal of dO O^T): where P_i is
    # one-hot (one visible key, o_i = v_j), dP_ij - delta_i cancels exactly, as in softmax's backward
    od = tl.dot(do, tl.trans(o), input_precision=PREC)
    delta = tl.sum(tl.where(i[:, None] == i[None, :], od, 0.0), axis=1)
    rows = row_offset(n, h, H, T, qs, BATCHED) + i
    if HAS_DLSE:
        delta -= tl.load(dlse_ptr + rows, mask=imask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, delta, mask=imask)


@triton.jit
def load_rows(lse_ptr, delta_ptr, rows, rmask):
    """``(lse * log2(e), delta)`` of some query rows; a row that sees no key (lse = -inf) gets 0,
    its P is masked anyway."""
    lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * KERNEL_LOG2E)
    return lse2, tl.load(delta_ptr + rows, mask=rmask, other=0.0)


@triton.jit
def dq_block(dq1, dq2, q1, q2, do, lse2, delta, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq, qk_scale, left,
             right, cap_in, cap_out, DQK: tl.constexpr, DV: tl.constexpr, LEFT: tl.constexpr, RIGHT: tl.constexpr,
             SOFTCAP: tl.constexpr, BN: tl.constexpr, BQ1: tl.constexpr, BQ2: tl.constexpr, BDV: tl.constexpr,
             PREC: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr):
    """``dQ += dS K`` (unscaled) over key block ``j0 .. j0 + BN - 1``, dQ as its two column tiles; MASKED
    and TMA as in the forward's ``attend``."""
    j = j0 + tl.arange(0, BN)
    k1, k2 = load_block(k_ptr, kd1, kd2, ks + j0, Sk - j0, hk, HK, DQK, BN, BQ1, BQ2, MASKED, TMA)
    v = load_block(v_ptr, vd, vd, ks + j0, Sk - j0, hk, HK, DV, BN, BDV, 0, MASKED, TMA)[0]
    s, capped = softcapped(dot_split(q1, q2, k1, k2, BQ2, PREC), cap_in, cap_out, SOFTCAP)
    p = tl.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        p = tl.where(visible(i[:, None], j[None, :], Tq, Sk, left, right, LEFT, RIGHT), p, 0.0)
    ds = p * (tl.dot(do, tl.trans(v), input_precision=PREC) - delta[:, None])
    if SOFTCAP:
        ds = ds * capped
    ds = ds.to(k1.dtype)
    dq1 = tl.dot(ds, k1, dq1, input_precision=PREC)
    if BQ2 > 0:
        dq2 = tl.dot(ds, k2, dq2, input_precision=PREC)
    return dq1, dq2


@triton.jit
def dq_kernel(q_ptr, k_ptr, v_ptr, kd1, kd2, vd, do_ptr, lse_ptr, delta_ptr, dq_ptr, cuq_ptr, cuk_ptr, scale, qk_scale,
              left, right, cap_in, cap_out, H, G, T, DQK: tl.constexpr, DV: tl.constexpr, BATCHED: tl.constexpr,
              LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BQ1: tl.constexpr, BQ2: tl.constexpr, BDV: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr):
    """dQ of query block ``program_id(0)`` of sequence ``program_id(1)``, query head ``program_id(2)``: the
    forward's key blocks (``key_blocks``), those every query of it sees whole without masks (``dq_block``)."""
    n = tl.program_id(1)
    h = tl.program_id(2)
    qs, Tq, ks, Sk = sequence(n, cuq_ptr, cuk_ptr)
    m0 = query_block(BM, RIGHT)
    if m0 >= Tq:
        return
    hk = h // G
    HK = H // G
    i = m0 + tl.arange(0, BM)
    q1, q2 = load_split(q_ptr, qs + m0, Tq - m0, h, H, DQK, BM, BQ1, BQ2)
    do = load_tile(do_ptr, qs + m0, Tq - m0, h, H, DV, 0, BM, BDV)
    lse2, delta = load_rows(lse_ptr, delta_ptr, row_offset(n, h, H, T, qs, BATCHED) + i, i < Tq)
    dq1, dq2 = zeros_split(BM, BQ1, BQ2)
    start, lo, hi, end = key_blocks(m0, BM, BN, Tq, Sk, left, right, LEFT, RIGHT)
    if LEFT:  # the masked blocks on the window's left (none without one)
        for j0 in range(start, tl.minimum(lo, end), BN):
            dq1, dq2 = dq_block(dq1, dq2, q1, q2, do, lse2, delta, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq,
                                qk_scale, left, right, cap_in, cap_out, DQK, DV, LEFT, RIGHT, SOFTCAP, BN, BQ1, BQ2, BDV,
                                PREC, True, TMA)
    for j0 in range(lo, hi, BN):
        dq1, dq2 = dq_block(dq1, dq2, q1, q2, do, lse2, delta, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq,
                            qk_scale, left, right, cap_in, cap_out, DQK, DV, LEFT, RIGHT, SOFTCAP, BN, BQ1, BQ2, BDV,
                            PREC, False, TMA)
    for j0 in range(tl.maximum(lo, hi), end, BN):
        dq1, dq2 = dq_block(dq1, dq2, q1, q2, do, lse2, delta, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq,
                            qk_scale, left, right, cap_in, cap_out, DQK, DV, LEFT, RIGHT, SOFTCAP, BN, BQ1, BQ2, BDV,
                            PREC, True, TMA)
    store_tile(dq_ptr, dq1 * scale, qs + m0, Tq - m0, h, H, DQK, 0, BM, BQ1)
    if BQ2 > 0:
        store_tile(dq_ptr, dq2 * scale, qs + m0, Tq - m0, h, H, DQK, BQ1, BM, BQ2)


@triton.jit
def dkdv_block(dk1, dk2, dv, k1, k2, v, q_ptr, do_ptr, qd1, qd2, dod, lse_ptr, delta_ptr, qs, m0, Tq, h, H, base, j,
               Sk, qk_scale, left, right, cap_in, cap_out, DQK: tl.constexpr, DV: tl.constexpr, LEFT: tl.constexpr,
               RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, BM: tl.constexpr, BQ1: tl.constexpr, BQ2: tl.constexpr,
               BDV: tl.constexpr, PREC: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr):
    """``dV += P^T dO`` and ``dK += dS^T Q`` (unscaled, dK as its two column tiles) over query block
    ``m0 .. m0 + BM - 1`` of head h, in the transposed ``[BN, BM]`` orientation; MASKED: some of these
    queries may not see some of the keys or not exist (``query_blocks``); TMA: q and dO load through the
    descriptors ``qd1``, ``qd2``, ``dod``."""
    i = m0 + tl.arange(0, BM)
    q1, q2 = load_block(q_ptr, qd1, qd2, qs + m0, Tq - m0, h, H, DQK, BM, BQ1, BQ2, MASKED, TMA)
    do = load_block(do_ptr, dod, dod, qs + m0, Tq - m0, h, H, DV, BM, BDV, 0, MASKED, TMA)[0]
    lse2, delta = load_rows(lse_ptr, delta_ptr, base + i, i < Tq)
    st, capped = softcapped(dot_split(k1, k2, q1, q2, BQ2, PREC), cap_in, cap_out, SOFTCAP)
    pt = tl.exp2(st * qk_scale - lse2[None, :])                                                 # [BN, BM]
    if MASKED:
        pt = tl.where(visible(i[None, :], j[:, None], Tq, Sk, left, right, LEFT, RIGHT), pt, 0.0)
    dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PREC)
    dst = pt * (tl.dot(v, tl.trans(do), input_precision=PREC) - delta[None, :])
    if SOFTCAP:
        dst = dst * capped
    dst = dst.to(q1.dtype)
    dk1 = tl.dot(dst, q1, dk1, input_precision=PREC)
    if BQ2 > 0:
        dk2 = tl.dot(dst, q2, dk2, input_precision=PREC)
    return dk1, dk2, dv


@triton.jit
def dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, qd1, qd2, dod, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cuq_ptr, cuk_ptr, scale,
                qk_scale, left, right, cap_in, cap_out, H, G, T, DQK: tl.constexpr, DV: tl.constexpr,
                BATCHED: tl.constexpr, LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BQ1: tl.constexpr, BQ2: tl.constexpr, BDV: tl.constexpr,
                PREC: tl.constexpr, TMA: tl.constexpr):
    """dK, dV of key block ``program_id(0)`` of sequence ``program_id(1)``, key head ``program_id(2)``:
    the G query heads of that key head in order, each over the query blocks that see the keys
    (``query_blocks``), those that see every key of the block unmasked (``dkdv_block``)."""
    n = tl.program_id(1)
    hk = tl.program_id(2)
    qs, Tq, ks, Sk = sequence(n, cuq_ptr, cuk_ptr)
    n0 = tl.program_id(0) * BN
    if n0 >= Sk:
        return
    HK = H // G
    j = n0 + tl.arange(0, BN)
    k1, k2 = load_split(k_ptr, ks + n0, Sk - n0, hk, HK, DQK, BN, BQ1, BQ2)
    v = load_tile(v_ptr, ks + n0, Sk - n0, hk, HK, DV, 0, BN, BDV)
    dk1, dk2 = zeros_split(BN, BQ1, BQ2)
    dv = tl.zeros((BN, BDV), tl.float32)
    first, a, b, last = query_blocks(n0, BN, BM, Tq, Sk, left, right, LEFT, RIGHT)
    for g in range(G):
        h = hk * G + g
        base = row_offset(n, h, H, T, qs, BATCHED)
        for m0 in range(first, a, BM):
            dk1, dk2, dv = dkdv_block(dk1, dk2, dv, k1, k2, v, q_ptr, do_ptr, qd1, qd2, dod, lse_ptr, delta_ptr, qs,
                                      m0, Tq, h, H, base, j, Sk, qk_scale, left, right, cap_in, cap_out, DQK, DV,
                                      LEFT, RIGHT, SOFTCAP, BM, BQ1, BQ2, BDV, PREC, True, TMA)
        for m0 in range(a, b, BM):
            dk1, dk2, dv = dkdv_block(dk1, dk2, dv, k1, k2, v, q_ptr, do_ptr, qd1, qd2, dod, lse_ptr, delta_ptr, qs,
                                      m0, Tq, h, H, base, j, Sk, qk_scale, left, right, cap_in, cap_out, DQK, DV,
                                      LEFT, RIGHT, SOFTCAP, BM, BQ1, BQ2, BDV, PREC, False, TMA)
        for m0 in range(b, last, BM):
            dk1, dk2, dv = dkdv_block(dk1, dk2, dv, k1, k2, v, q_ptr, do_ptr, qd1, qd2, dod, lse_ptr, delta_ptr, qs,
                                      m0, Tq, h, H, base, j, Sk, qk_scale, left, right, cap_in, cap_out, DQK, DV,
                                      LEFT, RIGHT, SOFTCAP, BM, BQ1, BQ2, BDV, PREC, True, TMA)
    store_tile(dk_ptr, dk1 * scale, ks + n0, Sk - n0, hk, HK, DQK, 0, BN, BQ1)
    if BQ2 > 0:
        store_tile(dk_ptr, dk2 * scale, ks + n0, Sk - n0, hk, HK, DQK, BQ1, BN, BQ2)
    store_tile(dv_ptr, dv, ks + n0, Sk - n0, hk, HK, DV, 0, BN, BDV)


def backward(q, k, v, o, lse, do, dlse, lay: Layout, dq_ladder: list[dict] | None = None,
             dkdv_ladder: list[dict] | None = None):
    """``(dq, dk, dv, delta)``, the gradients in the dtypes of q, k, v and ``delta = dO . o - dlse`` (fp32, lse's
    shape: a sink's gradient is ``-sum exp(sink - lse) delta``), from the flattened contiguous inputs, o, the
    forward's lse, dO (o's shape) and dlse (lse's shape, or None); the ladders override the launch
    settings of ``dq_kernel`` and ``dkdv_kernel`` (``benchmarks/attention_sweep.py``), a step may say
    ``TMA`` (default: wherever ``tma_aligned``)."""
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    consts = dict(DV=lay.dv, BATCHED=lay.batched, BDV=lay.bdv)
    grid_p = lay.grid(lay.max_q, PREPROCESS_BM, lay.heads)
    if grid_p:
        preprocess_kernel[grid_p](o, do, dlse if dlse is not None else lse, delta, lay.cu_q, lay.cu_k, lay.heads,
                                  lay.length, HAS_DLSE=dlse is not None, BM=PREPROCESS_BM, PREC=lay.precision,
                                  **consts)
    tiles = dict(DQK=lay.dqk, BQ1=lay.qk_tiles[0], BQ2=lay.qk_tiles[1], PREC=lay.precision, **lay.mask_consts,
                 **consts)
    common = (lay.cu_q, lay.cu_k, lay.scale, *lay.mask_args(), lay.heads, lay.group, lay.length)
    dq_ladder = dq_ladder or lay.ladders((DQ_BM, DQ_BM // 2, DQ_BM // 4), dq_keys(lay), sum(lay.qk_tiles))
    keys_tma, queries_tma = tma_aligned(k, v), tma_aligned(q, do)
    if lay.grid(lay.max_q, DQ_BM, lay.heads):
        def dq_args(step: dict) -> tuple:
            descs = block_descriptors(k, v, step["BN"], lay.qk_tiles, lay.bdv, step["TMA"])
            return (q, k, v, *descs, do, lse, delta, dq, *common)
        launch(dq_kernel, lambda meta: lay.grid(lay.max_q, meta["BM"], lay.heads), dq_args, tiles,
               [{"TMA": keys_tma} | step for step in dq_ladder])
    bn, bm = dkdv_blocks(lay)
    # then half the keys: fp32 "tf32x3" at Dqk = 89, Dv = 128 needed 245 KB at every step of 128 keys (H200)
    dkdv_ladder = dkdv_ladder or lay.ladders((bn, bn // 2), bm, lay.width, outer="BN", inner="BM")
    if lay.grid(lay.max_k, bn, lay.heads // lay.group):
        def dkdv_args(step: dict) -> tuple:
            descs = block_descriptors(q, do, step["BM"], lay.qk_tiles, lay.bdv, step["TMA"])
            return (q, k, v, do, *descs, lse, delta, dk, dv, *common)
        launch(dkdv_kernel, lambda meta: lay.grid(lay.max_k, meta["BN"], lay.heads // lay.group), dkdv_args, tiles,
               [{"TMA": queries_tma} | step for step in dkdv_ladder])
    return dq, dk, dv, delta
