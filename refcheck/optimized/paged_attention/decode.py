"""Paged decode attention, split over the keys (FlashDecoding) and combined by log-sum-exp.

A decode step has few queries per sequence (Tq, one to a few) and many keys, so a program per sequence
and key head would leave most of a GPU idle on a small batch. The keys of each sequence are cut into
``splits`` ranges of ``keys_per_split`` keys; program ``(n, hk, s)`` attends the ``Tq * G`` query rows of
sequence n on key head hk (G = H / Hk query heads share it: one dot serves them all) to the keys of range
s, reading each key through the block table (key j: row ``j % page`` of page ``block_table[n, j // page]``,
so a block of BN keys may span several pages and any page size works). Each step's page numbers are read one
step ahead, so that its cache loads do not wait on the block table. With ``c = scale * log2(e)``:

    s_rj = c q_r . k_j      (-inf where key j is past row r's token: j > L - Tq + i(r), or past L)
    m_r <- max(m_r, max_j s_rj),  p_rj = 2^(s_rj - m_r),  l_r <- l_r 2^(m_old - m_r) + sum_j p_rj,
    a_r <- a_r 2^(m_old - m_r) + sum_j p_rj v_j

and the program writes ``o_rs = a_r / l_r`` and ``lse_rs = (m_r + log2 l_r) / log2(e)`` (``-inf`` for a
range with no key the row sees) in fp32. ``combine`` then forms, per row, ``lse = log sum_s exp(lse_rs)``
and ``o = sum_s exp(lse_rs - lse) o_rs``. Keys past a sequence's tokens are loaded masked (as 0), never
multiplied by 0: the rows of a page past the tokens are memory no sequence owns. ``p`` is rounded to the
input dtype before ``p v`` for bf16/fp16; fp32 inputs keep fp32 and the dots run at ``PREC``. A head dim
that is not a power of two is two column tiles (``common.column_tiles``: MLA's absorbed 576 = 512 + 64).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import KERNEL_LOG2E, LOG2E, column_tiles, launch, padded

TARGET_PROGRAMS = 1056
"""Programs the split aims at when ``splits`` is not given: eight per multiprocessor of an H100/H200 (132), for
loads in flight (H200, MLA's absorbed shape at batch 64 and caches of 32k: 0.66 of the copy rate at 264
programs, 0.93 at 1056; GQA's within 4% either way: ``paged_attention_sweep_h200.json``)."""
LAUNCH = dict(num_warps=4, num_stages=2)
"""The split kernel's launch settings, the best of the H200 sweep at every shape (``decode(config=...)``
overrides them, and BN)."""


def keys_per_step(dqk: int) -> int:
    """Keys per step of a program's walk (BN): 64, or 32 for MLA's absorbed 576 (its K tile is 576 wide; 64 keys
    there ran at half the rate, 128 do not fit). H200 sweep: GQA d128 at 64 keys 1.05 and 1.03 of the copy rate,
    at 32 keys 0.89 and 0.90, at 128 keys 1.00 and 0.98."""
    return 64 if dqk <= 256 else 32


def plan_splits(n: int, hk: int, max_keys: int, splits: int | None, block: int) -> tuple[int, int]:
    """``(splits, keys_per_split)`` for ``n`` sequences on ``hk`` key heads and at most ``max_keys`` keys
    each: ``splits`` ranges (default enough for ``TARGET_PROGRAMS`` programs, at most one per key block),
    each a multiple of ``block`` keys."""
    blocks = max(1, -(-max_keys // block))
    want = splits if splits is not None else -(-TARGET_PROGRAMS // max(1, n * hk))
    count = max(1, min(want, blocks))
    per = -(-blocks // count) * block
    return -(-max_keys // per) if max_keys else 1, per


@triton.jit
def _load_cols(ptr, rows, ok, C0: tl.constexpr, D: tl.constexpr, BC: tl.constexpr):
    """``ptr[rows, C0 + c]`` ``[len(rows), BC]``: rows are int64 element offsets, ``ok`` which exist; 0 elsewhere."""
    c = C0 + tl.arange(0, BC)
    return tl.load(ptr + rows[:, None] + c[None, :], mask=ok[:, None] & (c[None, :] < D), other=0.0)


@triton.jit
def split_kernel(q_ptr, k_ptr, v_ptr, table_ptr, used_ptr, o_ptr, lse_ptr, qk_scale,
                 sk_page, sk_row, sk_head, sv_page, sv_row, sv_head, s_table, s_used,
                 TQ, H, KEYS_PER_SPLIT, SPLITS,
                 G: tl.constexpr, PAGE: tl.constexpr, DQK: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr, BDV: tl.constexpr, PREC: tl.constexpr):
    n = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    length = tl.load(used_ptr + n * s_used).to(tl.int32)
    r = tl.arange(0, BM)
    i = r // G                                   # the row's query (token L - Tq + i)
    head = hk * G + r % G
    row_ok = i < TQ
    q_rows = ((n * TQ + i).to(tl.int64) * H + head) * DQK
    q1 = _load_cols(q_ptr, q_rows, row_ok, 0, DQK, B1)
    if B2 > 0:
        q2 = _load_cols(q_ptr, q_rows, row_ok, B1, DQK, B2)
    last = length - TQ + i                       # the last key each row sees
    j_start = s * KEYS_PER_SPLIT
    j_end = tl.minimum(j_start + KEYS_PER_SPLIT, length)
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BDV), tl.float32)
    table_row = table_ptr + n.to(tl.int64) * s_table
    j_next = j_start + tl.arange(0, BN)
    page_next = tl.load(table_row + j_next // PAGE, mask=j_next < j_end, other=0).to(tl.int64)
    for j0 in range(j_start, j_end, BN):
        j = j0 + tl.arange(0, BN)
        key_ok = j < j_end
        page = page_next             # this step's pages, read a step ahead: the cache loads do not wait on the table
        j_next = j + BN
        page_next = tl.load(table_row + j_next // PAGE, mask=j_next < j_end, other=0).to(tl.int64)
        k_rows = page * sk_page + (j % PAGE).to(tl.int64) * sk_row + hk * sk_head
        v_rows = page * sv_page + (j % PAGE).to(tl.int64) * sv_row + hk * sv_head
        k1 = _load_cols(k_ptr, k_rows, key_ok, 0, DQK, B1)
        scores = tl.dot(q1, tl.trans(k1), input_precision=PREC)
        if B2 > 0:
            k2 = _load_cols(k_ptr, k_rows, key_ok, B1, DQK, B2)
            scores += tl.dot(q2, tl.trans(k2), input_precision=PREC)
        seen = key_ok[None, :] & (j[None, :] <= last[:, None]) & row_ok[:, None]
        scores = tl.where(seen, scores * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(scores - base[:, None])
        alpha = tl.math.exp2(m - base)
        l = l * alpha + tl.sum(p, 1)
        v = _load_cols(v_ptr, v_rows, key_ok, 0, DV, BDV)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m = m_new
    held = l > 0
    lse = tl.where(held, (m + tl.math.log2(tl.where(held, l, 1.0))) / KERNEL_LOG2E, float("-inf"))
    o = acc / tl.where(held, l, 1.0)[:, None]
    d = tl.arange(0, BDV)
    part = ((n * SPLITS + s) * TQ + i).to(tl.int64) * H + head            # [N, splits, Tq, H]
    tl.store(o_ptr + part[:, None] * DV + d[None, :], o, mask=row_ok[:, None] & (d[None, :] < DV))
    tl.store(lse_ptr + part, lse, mask=row_ok)


@triton.jit
def combine_kernel(o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, TQ, H, SPLITS,
                   DV: tl.constexpr, BS: tl.constexpr, BDV: tl.constexpr):
    n = tl.program_id(0)
    i = tl.program_id(1)
    h = tl.program_id(2)
    sp = tl.arange(0, BS)
    split_ok = sp < SPLITS
    part = ((n * SPLITS + sp) * TQ + i).to(tl.int64) * H + h
    lse_s = tl.load(lse_part_ptr + part, mask=split_ok, other=float("-inf"))
    top = tl.max(lse_s, 0)
    w = tl.where(lse_s == float("-inf"), 0.0, tl.exp(lse_s - top))
    total = tl.sum(w, 0)
    d = tl.arange(0, BDV)
    o_s = tl.load(o_part_ptr + part[:, None] * DV + d[None, :], mask=split_ok[:, None] & (d[None, :] < DV), other=0.0)
    o = tl.sum(w[:, None] * o_s, 0) / total
    row = (n * TQ + i).to(tl.int64) * H + h                               # o [N, Tq, H, Dv]
    tl.store(o_ptr + row * DV + d, o.to(o_ptr.dtype.element_ty), mask=d < DV)
    tl.store(lse_ptr + (n.to(tl.int64) * H + h) * TQ + i, top + tl.log(total))   # lse [N, H, Tq]


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
           seqused_k: torch.Tensor, scale: float, precision: str, splits: int | None,
           config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o [N, Tq, H, Dv], lse [N, H, Tq] fp32)`` of checked inputs: q contiguous, the caches with a unit
    last stride; ``splits`` the key ranges per sequence (None: ``plan_splits``); ``config`` the split kernel's
    BN and launch settings (default ``keys_per_step`` and ``LAUNCH``)."""
    n, tq, h, dqk = q.shape
    hk, page, dv = k_cache.shape[2], k_cache.shape[1], v_cache.shape[-1]
    group = h // hk
    step = dict(LAUNCH, **(config or {}))
    block = step.pop("BN", None) or keys_per_step(dqk)
    count, per = plan_splits(n, hk, block_table.shape[1] * page, splits, block)
    o_part = torch.empty(n, count, tq, h, dv, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(n, count, tq, h, dtype=torch.float32, device=q.device)
    b1, b2 = column_tiles(dqk)
    launch(split_kernel, (n, hk, count),
           (q, k_cache, v_cache, block_table, seqused_k, o_part, lse_part, scale * LOG2E,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), block_table.stride(0), seqused_k.stride(0), tq, h, per, count),
           dict(G=group, PAGE=page, DQK=dqk, DV=dv, BM=padded(tq * group), BN=block, B1=b1, B2=b2,
                BDV=padded(dv), PREC=precision),
           [step])
    o = torch.empty(n, tq, h, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(n, h, tq, dtype=torch.float32, device=q.device)
    launch(combine_kernel, (n, tq, h), (o_part, lse_part, o, lse, tq, h, count),
           dict(DV=dv, BS=triton.next_power_of_2(count), BDV=padded(dv)), [dict(num_warps=4)])
    return o, lse
