"""Attention forward: one pass over the keys with an online softmax (FlashAttention-2).

Per sequence and query head h (key head ``h // G``), a program owns BM query rows i and walks the
key blocks j (BN keys) it can see, in base 2 with ``c = scale * log2(e)``:

    s_ij = c q_i . k_j                  (softcap: log2(e) softcap tanh(scale q_i . k_j / softcap);
                                         -inf where key j is outside query i's window, ``tiles.visible``)
    m_i  <- max(m_i, max_j s_ij)        running maximum, fp32 ``[BM]``
    p_ij = 2^(s_ij - m_i)
    l_i  <- l_i 2^(m_old - m_i) + sum_j p_ij
    a_i  <- a_i 2^(m_old - m_i) + sum_j p_ij v_j     fp32 ``[BM, Dv]``

then ``o_i = a_i / l_i`` and ``lse_i = (m_i + log2 l_i) / log2(e)``; a row that sees no key keeps
``l_i = 0`` and gets ``o_i = 0``, ``lse_i = -inf``. A sink (gpt-oss) is a key of score ``sinks[h]`` and value
0: the walk starts from it, ``m_i = sinks[h] log2(e)``, ``l_i = 1``. A window's program walks only the key
blocks inside it (``tiles.key_blocks``), so a narrow window costs less, not more. ``p`` is rounded to the input dtype before
``p v`` (bf16/fp16 tensor cores); fp32 inputs keep fp32 and the dots run at ``PREC``.

fp8 (e4m3/e5m2) q, k, v hold ``x / descale_x`` per tensor: ``q k^T`` is an fp8 dot whose descales
fold into c, ``p v`` a bf16 dot (v widened exactly, p rounded to bf16), ``a_i`` scaled by descale_v;
o comes out in bf16.

Key and value blocks load through TMA descriptors where k and v allow one (``tiles.load_block``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..common import KERNEL_LOG2E, launch, tma_aligned
from .layout import Layout
from .tiles import (
    block_descriptors,
    block_row,
    dot_split,
    key_blocks,
    load_block,
    load_split,
    row_offset,
    sequence,
    softcapped,
    store_tile,
    visible,
)


def keys_per_step(lay: Layout) -> int:
    """Keys per step of the forward's walk (BN): 128, or 64 where the tiles are ``wide``. Measured on an
    H100, bf16, B=8 T=2048 H=16 (``benchmarks/attention_sweep.py``, ``results/attention_sweep_h100.json``):
    Dqk = Dv = 128 0.603 ms at 128 against 0.618 at 64; MLA (wide) 0.734 ms at 64, where 128 needs more
    shared memory than three load stages have."""
    return 64 if lay.wide else 128


@triton.jit
def attend(acc, m, l, q1, q2, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq, qk_scale, left, right, cap_in,
           cap_out, DQK: tl.constexpr, DV: tl.constexpr, LEFT: tl.constexpr, RIGHT: tl.constexpr,
           SOFTCAP: tl.constexpr, BN: tl.constexpr, BQ1: tl.constexpr, BQ2: tl.constexpr, BDV: tl.constexpr,
           PREC: tl.constexpr, FP8: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr):
    """The online-softmax update of ``(acc [BM, BDV], m [BM], l [BM])`` by key block ``j0 .. j0 + BN - 1``;
    MASKED: some query of the block may not see some of these keys (``key_blocks``), else all exist and are
    seen, and the block needs no mask. TMA: the block loads through the descriptors ``kd1``, ``kd2`` (k's column
    tiles) and ``vd``."""
    j = j0 + tl.arange(0, BN)
    k1, k2 = load_block(k_ptr, kd1, kd2, ks + j0, Sk - j0, hk, HK, DQK, BN, BQ1, BQ2, MASKED, TMA)
    v = load_block(v_ptr, vd, vd, ks + j0, Sk - j0, hk, HK, DV, BN, BDV, 0, MASKED, TMA)[0]
    # unscaled: c > 0 scales inside the max and exp2
    s = softcapped(dot_split(q1, q2, k1, k2, BQ2, PREC), cap_in, cap_out, SOFTCAP)[0]
    if MASKED:
        s = tl.where(visible(i[:, None], j[None, :], Tq, Sk, left, right, LEFT, RIGHT), s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)     # rows that saw no key yet: p = 0
    alpha = tl.exp2(m - shift)
    p = tl.exp2(s * qk_scale - shift[:, None])               # one FMA an element
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]                                # p v accumulates into it: one fp32 tile
    if FP8:
        acc = tl.dot(p.to(tl.bfloat16), v.to(tl.bfloat16), acc)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC)
    return acc, m_new, l


@triton.jit
def forward_tile(q_ptr, k_ptr, v_ptr, kd1, kd2, vd, o_ptr, lse_ptr, cuq_ptr, cuk_ptr, sinks_ptr, qk_scale, v_descale,
                 left, right, cap_in, cap_out, H, G, T, b, NB, n, h, DQK: tl.constexpr, DV: tl.constexpr,
                 BATCHED: tl.constexpr, LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
                 SINKS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BQ1: tl.constexpr, BQ2: tl.constexpr,
                 BDV: tl.constexpr, PREC: tl.constexpr, FP8: tl.constexpr, TMA: tl.constexpr):
    """Query block ``b`` of ``NB`` (``block_row``) of sequence n, query head h: its key blocks (``key_blocks``),
    those every query of it sees whole without masks (``attend``); o and lse stored. With SINKS the running
    softmax starts at head h's sink, a key of value 0: ``m = sinks[h] log2(e)``, ``l = 1``."""
    qs, Tq, ks, Sk = sequence(n, cuq_ptr, cuk_ptr)
    m0 = block_row(b, NB, BM, RIGHT)
    if m0 < Tq:
        hk = h // G
        HK = H // G
        i = m0 + tl.arange(0, BM)
        q1, q2 = load_split(q_ptr, qs + m0, Tq - m0, h, H, DQK, BM, BQ1, BQ2)
        if SINKS:
            m = tl.full((BM,), 0.0, tl.float32) + tl.load(sinks_ptr + h).to(tl.float32) * KERNEL_LOG2E
            l = tl.full((BM,), 1.0, tl.float32)
        else:
            m = tl.full((BM,), float("-inf"), tl.float32)
            l = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, BDV), tl.float32)
        start, lo, hi, end = key_blocks(m0, BM, BN, Tq, Sk, left, right, LEFT, RIGHT)
        if LEFT:  # the masked blocks on the window's left (none without one)
            for j0 in range(start, tl.minimum(lo, end), BN):
                acc, m, l = attend(acc, m, l, q1, q2, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq, qk_scale,
                                   left, right, cap_in, cap_out, DQK, DV, LEFT, RIGHT, SOFTCAP, BN, BQ1, BQ2, BDV, PREC,
                                   FP8, True, TMA)
        for j0 in range(lo, hi, BN):
            acc, m, l = attend(acc, m, l, q1, q2, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq, qk_scale,
                               left, right, cap_in, cap_out, DQK, DV, LEFT, RIGHT, SOFTCAP, BN, BQ1, BQ2, BDV, PREC,
                               FP8, False, TMA)
        for j0 in range(tl.maximum(lo, hi), end, BN):
            acc, m, l = attend(acc, m, l, q1, q2, k_ptr, v_ptr, kd1, kd2, vd, ks, j0, Sk, hk, HK, i, Tq, qk_scale,
                               left, right, cap_in, cap_out, DQK, DV, LEFT, RIGHT, SOFTCAP, BN, BQ1, BQ2, BDV, PREC,
                               FP8, True, TMA)
        if FP8:
            acc *= v_descale
        seen = l > 0
        o = acc / tl.where(seen, l, 1.0)[:, None]
        store_tile(o_ptr, o, qs + m0, Tq - m0, h, H, DV, 0, BM, BDV)
        lse = tl.where(seen, (m + tl.log2(tl.where(seen, l, 1.0))) / KERNEL_LOG2E, float("-inf"))
        tl.store(lse_ptr + row_offset(n, h, H, T, qs, BATCHED) + i, lse, mask=i < Tq)


@triton.jit
def forward_kernel(q_ptr, k_ptr, v_ptr, kd1, kd2, vd, o_ptr, lse_ptr, cuq_ptr, cuk_ptr, sinks_ptr, qk_scale, v_descale,
                   left, right, cap_in, cap_out, H, G, T, DQK: tl.constexpr, DV: tl.constexpr, BATCHED: tl.constexpr,
                   LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BQ1: tl.constexpr, BQ2: tl.constexpr, BDV: tl.constexpr,
                   PREC: tl.constexpr, FP8: tl.constexpr, TMA: tl.constexpr):
    """One program per tile: query block ``program_id(0)`` of sequence ``program_id(1)``, head ``program_id(2)``."""
    forward_tile(q_ptr, k_ptr, v_ptr, kd1, kd2, vd, o_ptr, lse_ptr, cuq_ptr, cuk_ptr, sinks_ptr, qk_scale, v_descale,
                 left, right, cap_in, cap_out, H, G, T, tl.program_id(0), tl.num_programs(0), tl.program_id(1),
                 tl.program_id(2), DQK, DV, BATCHED, LEFT, RIGHT, SOFTCAP, SINKS, BM, BN, BQ1, BQ2, BDV, PREC, FP8,
                 TMA)


@triton.jit
def forward_persistent_kernel(q_ptr, k_ptr, v_ptr, kd1, kd2, vd, o_ptr, lse_ptr, cuq_ptr, cuk_ptr, sinks_ptr, qk_scale,
                              v_descale, left, right, cap_in, cap_out, H, G, T, NB, N, DQK: tl.constexpr,
                              DV: tl.constexpr, BATCHED: tl.constexpr, LEFT: tl.constexpr, RIGHT: tl.constexpr,
                              SOFTCAP: tl.constexpr, SINKS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                              BQ1: tl.constexpr, BQ2: tl.constexpr, BDV: tl.constexpr, PREC: tl.constexpr,
                              FP8: tl.constexpr, TMA: tl.constexpr):
    """A fixed grid of programs, each taking tiles ``program_id(0)``, ``+ num_programs(0)``, ... of the
    ``NB * N * H`` (query block, sequence, head) tiles, query block outermost: every sequence and head
    gets its causal-longest blocks first, as the one-program-per-tile launch orders them."""
    for t in range(tl.program_id(0), NB * N * H, tl.num_programs(0)):
        b = t // (N * H)
        n = t % (N * H) // H
        forward_tile(q_ptr, k_ptr, v_ptr, kd1, kd2, vd, o_ptr, lse_ptr, cuq_ptr, cuk_ptr, sinks_ptr, qk_scale,
                     v_descale, left, right, cap_in, cap_out, H, G, T, b, NB, n, t % H, DQK, DV, BATCHED, LEFT, RIGHT,
                     SOFTCAP, SINKS, BM, BN, BQ1, BQ2, BDV, PREC, FP8, TMA)


SCHEDULES = ("grid", "persistent")
"""The forward's schedules: one program per tile, or ``persistent_programs`` programs looping over the tiles."""


def persistent_programs(device: torch.device, tiles: int) -> int:
    """Programs of the persistent forward: one per SM of the GPU (the tiles hold 8 warps and most of an
    SM's shared memory: one fits), at most one per tile; in the CPU interpreter two, so that a program
    loops over several tiles there too."""
    if device.type == "cuda":
        return min(tiles, torch.cuda.get_device_properties(device).multi_processor_count)
    return min(tiles, 2)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lay: Layout, block_m: int,
            descale: tuple[float, float, float] | None = None, ladder: list[dict] | None = None,
            schedule: str = "grid", sinks: torch.Tensor | None = None):
    """``(o [tokens, H, Dv] in q's dtype (fp8: bf16), lse fp32 [B, H, T])`` of flattened contiguous q
    ``[tokens, H, Dqk]``, k ``[keys, Hk, Dqk]``, v ``[keys, Hk, Dv]`` and the sinks ``[H]`` or None; fp8 inputs with their
    ``descale = (descale_q, descale_k, descale_v)``; ``schedule`` one of ``SCHEDULES``; ``block_m`` query rows
    a program (half as many where none of the launch settings of that many fits the GPU); a ``ladder`` step
    may say ``BM`` (default ``block_m``) and ``TMA`` (default: wherever ``tma_aligned``)."""
    dsq, dsk, dsv = descale or (1.0, 1.0, 1.0)
    o = torch.empty(*q.shape[:2], v.shape[-1], device=q.device, dtype=q.dtype if descale is None else torch.bfloat16)
    lse = torch.empty(lay.batch, lay.heads, lay.length, device=q.device, dtype=torch.float32)
    if lay.grid(lay.max_q, block_m, lay.heads):
        persistent = schedule == "persistent"

        def tiles(step: dict) -> tuple[int, int, int]:
            return lay.grid(lay.max_q, step["BM"], lay.heads) or (0, 0, 0)

        def grid(meta: dict) -> tuple[int, ...]:
            return (persistent_programs(q.device, math.prod(tiles(meta))),) if persistent else tiles(meta)

        def args(step: dict) -> tuple:
            descs = block_descriptors(k, v, step["BN"], lay.qk_tiles, lay.bdv, step["TMA"])
            qk_scale, *mask = lay.mask_args(dsq * dsk)
            return (q, k, v, *descs, o, lse, lay.cu_q, lay.cu_k, lse if sinks is None else sinks, qk_scale, dsv,
                    *mask, lay.heads, lay.group, lay.length, *(tiles(step)[:2] if persistent else ()))
        # block_m rows first; where no step of them fits the GPU's shared memory (fp32 at head dims 256 with
        # "tf32x3" needed 327680 B at its last step of 128 rows, offline for sm_90), half as many
        ladder = ladder or lay.ladders((block_m, block_m // 2), keys_per_step(lay), lay.bdv)
        launch(forward_persistent_kernel if persistent else forward_kernel, grid, args,
               dict(DQK=lay.dqk, DV=lay.dv, BATCHED=lay.batched, BQ1=lay.qk_tiles[0], BQ2=lay.qk_tiles[1],
                    BDV=lay.bdv, PREC=lay.precision, FP8=descale is not None, SINKS=sinks is not None,
                    **lay.mask_consts),
               [{"TMA": tma_aligned(k, v), "BM": block_m} | step for step in ladder])
    return o, lse
