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

from ..common import launch
from .layout import Layout
from .tiles import KERNEL_LOG2E, LOG2E, causal_key_end, load_tile, row_offset, sequence, store_tile, visible

BLOCK = 64
"""Query and key block of the backward kernels."""


@triton.jit
def preprocess_kernel(o_ptr, do_ptr, dlse_ptr, delta_ptr, cuq_ptr, cuk_ptr, H, T, DV, BATCHED: tl.constexpr,
                      HAS_DLSE: tl.constexpr, BM: tl.constexpr, BDV: tl.constexpr, PREC: tl.constexpr):
    """``delta`` of query block ``program_id(0)`` of sequence ``program_id(1)``, head ``program_id(2)``."""
    n = tl.program_id(1)
    h = tl.program_id(2)
    qs, Tq, _, _ = sequence(n, cuq_ptr, cuk_ptr)
    i = tl.program_id(0) * BM + tl.arange(0, BM)
    imask = i < Tq
    cv = tl.arange(0, BDV)
    vmask = cv < DV
    o = load_tile(o_ptr, qs + i, imask, h, H, DV, cv, vmask)
    do = load_tile(do_ptr, qs + i, imask, h, H, DV, cv, vmask)
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
def dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cuq_ptr, cuk_ptr, scale, qk_scale, H, G, T,
              DQK, DV, BATCHED: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BDQK: tl.constexpr, BDV: tl.constexpr, PREC: tl.constexpr):
    """dQ of query block ``program_id(0)`` of sequence ``program_id(1)``, query head ``program_id(2)``."""
    n = tl.program_id(1)
    h = tl.program_id(2)
    qs, Tq, ks, Sk = sequence(n, cuq_ptr, cuk_ptr)
    m0 = tl.program_id(0) * BM
    if m0 >= Tq:
        return
    hk = h // G
    HK = H // G
    i = m0 + tl.arange(0, BM)
    imask = i < Tq
    cq = tl.arange(0, BDQK)
    cv = tl.arange(0, BDV)
    qmask = cq < DQK
    vmask = cv < DV
    q = load_tile(q_ptr, qs + i, imask, h, H, DQK, cq, qmask)
    do = load_tile(do_ptr, qs + i, imask, h, H, DV, cv, vmask)
    lse2, delta = load_rows(lse_ptr, delta_ptr, row_offset(n, h, H, T, qs, BATCHED) + i, imask)
    dq = tl.zeros((BM, BDQK), tl.float32)
    for j0 in range(0, causal_key_end(m0, BM, Tq, Sk, CAUSAL), BN):
        j = j0 + tl.arange(0, BN)
        jmask = j < Sk
        k = load_tile(k_ptr, ks + j, jmask, hk, HK, DQK, cq, qmask)
        v = load_tile(v_ptr, ks + j, jmask, hk, HK, DV, cv, vmask)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        p = tl.where(visible(i[:, None], j[None, :], Tq, Sk, CAUSAL), tl.exp2(s - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    store_tile(dq_ptr, dq * scale, qs + i, imask, h, H, DQK, cq, qmask)


@triton.jit
def dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cuq_ptr, cuk_ptr, scale, qk_scale,
                H, G, T, DQK, DV, BATCHED: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BDQK: tl.constexpr, BDV: tl.constexpr, PREC: tl.constexpr):
    """dK, dV of key block ``program_id(0)`` of sequence ``program_id(1)``, key head ``program_id(2)``:
    the G query heads of that key head in order, each over the query blocks that see the keys."""
    n = tl.program_id(1)
    hk = tl.program_id(2)
    qs, Tq, ks, Sk = sequence(n, cuq_ptr, cuk_ptr)
    n0 = tl.program_id(0) * BN
    if n0 >= Sk:
        return
    HK = H // G
    j = n0 + tl.arange(0, BN)
    jmask = j < Sk
    cq = tl.arange(0, BDQK)
    cv = tl.arange(0, BDV)
    qmask = cq < DQK
    vmask = cv < DV
    k = load_tile(k_ptr, ks + j, jmask, hk, HK, DQK, cq, qmask)
    v = load_tile(v_ptr, ks + j, jmask, hk, HK, DV, cv, vmask)
    dk = tl.zeros((BN, BDQK), tl.float32)
    dv = tl.zeros((BN, BDV), tl.float32)
    first = 0
    if CAUSAL:                               # the first query that sees key n0: i >= n0 - (Sk - Tq)
        first = (tl.maximum(n0 - (Sk - Tq), 0) // BM) * BM
    for g in range(G):
        h = hk * G + g
        base = row_offset(n, h, H, T, qs, BATCHED)
        for m0 in range(first, Tq, BM):
            i = m0 + tl.arange(0, BM)
            imask = i < Tq
            q = load_tile(q_ptr, qs + i, imask, h, H, DQK, cq, qmask)
            do = load_tile(do_ptr, qs + i, imask, h, H, DV, cv, vmask)
            lse2, delta = load_rows(lse_ptr, delta_ptr, base + i, imask)
            st = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale                   # [BN, BM]
            pt = tl.where(visible(i[None, :], j[:, None], Tq, Sk, CAUSAL), tl.exp2(st - lse2[None, :]), 0.0)
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
            dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
    store_tile(dk_ptr, dk * scale, ks + j, jmask, hk, HK, DQK, cq, qmask)
    store_tile(dv_ptr, dv, ks + j, jmask, hk, HK, DV, cv, vmask)


def backward(q, k, v, o, lse, do, dlse, lay: Layout):
    """``(dq, dk, dv)`` in the dtypes of q, k, v, from the flattened contiguous inputs, o, the
    forward's lse, dO (o's shape) and dlse (lse's shape, or None)."""
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    consts = dict(BATCHED=lay.batched, BDV=lay.bdv)
    grid_q = lay.grid(lay.max_q, BLOCK, lay.heads)
    if grid_q:
        preprocess_kernel[grid_q](o, do, dlse if dlse is not None else lse, delta, lay.cu_q, lay.cu_k, lay.heads,
                                  lay.length, lay.dv, HAS_DLSE=dlse is not None, BM=BLOCK, PREC=lay.precision,
                                  **consts)
    tiles = dict(CAUSAL=lay.causal, BDQK=lay.bdqk, PREC=lay.precision, **consts)
    common = (lay.cu_q, lay.cu_k, lay.scale, lay.scale * LOG2E, lay.heads, lay.group, lay.length, lay.dqk, lay.dv)
    if grid_q:
        launch(dq_kernel, grid_q, (q, k, v, do, lse, delta, dq, *common), dict(BM=BLOCK, **tiles),
               lay.ladder(BLOCK, BLOCK))
    grid_k = lay.grid(lay.max_k, BLOCK, lay.heads // lay.group)
    if grid_k:
        launch(dkdv_kernel, grid_k, (q, k, v, do, lse, delta, dk, dv, *common), dict(BN=BLOCK, **tiles),
               lay.ladder(BLOCK, BLOCK, inner="BM"))
    return dq, dk, dv
