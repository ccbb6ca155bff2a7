"""Decayed operands of KDA's serial state passes, formed in parallel before them: ``k e^G``,
``k e^{G_last - G}`` and ``q e^G`` per chunk, stored row-scaled in the precision the passes' dots use. The forward
forms them in the kernel that normalizes q and k (``kda.front``, through ``decays``, ``store_key_operands`` and
``store_prepared``) and the backward reads the forward's; ``prepare_keys`` forms them apart, from q, k and G as
stored (the front's reference in the tests, and the benchmarks' stage).

The serial kernels walk the chunks of a sequence one after another, so each chunk's latency adds up: a
step that loads k and G, forms ``e^G`` and ``e^{G_last - G}`` on ``[C, K]`` tiles and only then reaches
its dots waits on all of it, and its loads cannot be issued ahead (the pipeliner prefetches loads that
feed dots). Formed here, one program per (chunk, head, scale block), the operands are plain loads
into the serial step's dots, which the pass double-buffers.

Stored as ``x = s * X`` with ``s [T, H, NSB]`` the power of two at or above the largest magnitude of each
row within each column block of ``SCALE_BLOCK`` (``PreparedKeys.block``; a pass's state blocks lie within one) and
``X`` in ``operand_dtype(precision)``: fp16 where the dots run at "tf32", which rounds its operands to the same 11
significant bits, so storing them in fp16 loses nothing the dot keeps (and the row scale keeps them in fp16's range
whatever the input's magnitude); fp32 for "ieee" and "tf32x3". Half the bytes of the fp32 operands, and a third of
what k (16-bit) and G (fp32) took read twice. A power of two makes ``s X`` exact, so a pass applies the row scales
outside its dots or inside, to the first operand (``state.rows_dot``, ``state.update_block``):

    (x S)_i = s_i (X S)_i = ((Diag(s) X) S)_i,        x^T U = X^T (Diag(s) U) = (Diag(s) X)^T U
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common import Chunks, launch, padded
from .scaled import row_scaled, scale_rows
from .state import state_blocks
from .tiles import (
    chunk_rows,
    decay,
    load_gate,
    load_gate_row,
    load_tile,
    row_offsets,
    store_tile,
)

PREPARE_LAUNCH = dict(num_warps=8, num_stages=1)
"""Measured on an H200 (bf16, B=8, T=4096, H=16, K=128, at bb3ef4b): the forward's operands 0.257 ms at 4 warps,
0.239 at 8, 0.272 at 2; the backward's (with ``q e^G``) 0.446, 0.405, 0.599. A program for every state block of a
chunk (no third grid axis) gave 0.256 / 0.246 and 0.432 / 0.395 at 4 / 8 warps: not worth a second launch shape."""


SCALE_BLOCK = 128
"""The widest column block that shares a row scale. A scale is a power of two, so the wider block changes a stored
entry only where it lies 2^14 below its row's largest (fp16's subnormals): o's and every gradient's error against
float64 the same to three digits (interpreted and on an H200). Measured against blocks of 64 on an H200 (bf16, B=8,
T=4096, H=16, K=V=128, at 56d920f): the preparation 0.226 -> 0.209 ms
(with ``q e^G`` 0.379 -> 0.282), the reverse pass 0.903 -> 0.825 (one scale load a step where it took two), the
forward pass and the backward's recomputation together 0.898 -> 0.861 (the state in one block of 128 then)."""


def operand_dtype(precision: str) -> torch.dtype:
    """fp16 under "tf32" (the dot keeps 11 significant bits of an fp32 operand: fp16's), else fp32."""
    return torch.float16 if row_scaled(precision) else torch.float32


@triton.jit
def store_prepared(x_ptr, s_ptr, x, rows, rmask, h, H, K, kb, NKB, cols, cmask):
    """``x [C, KB]`` as its row scales ``s[rows, h, kb]`` (powers of two, ``scaled.scale_rows``) and ``x / s`` in
    ``x_ptr``'s dtype."""
    X, s = scale_rows(x)
    store_tile(x_ptr, X, rows, rmask, h, H, K, cols, cmask)
    tl.store(s_ptr + row_offsets(rows, h, H, NKB) + kb, s, mask=rmask)


@triton.jit
def decays(G, G_last):
    """``(e^G, e^{G_last - G})`` ``[C, KB]`` in fp32 from a chunk's cumulative gate tile and its last row ``[KB]``,
    each exponent taken in G's dtype (``tiles.decay``)."""
    return decay(G), decay(G_last[None, :] - G)


@triton.jit
def chunk_decays(G_ptr, t0, n, grows, h, H, K, cols, cmask):
    """A chunk's ``decays`` from its cumulative gate G in memory (its rows ``grows`` clamped to the last, n rows from
    token t0)."""
    return decays(load_gate(G_ptr, grows, grows >= 0, h, H, K, cols, cmask),
                  load_gate_row(G_ptr, t0 + n - 1, h, H, K, cols, cmask))


@triton.jit
def store_key_operands(kg_ptr, sg_ptr, kd_ptr, sd_ptr, k, eG, eD, rows, rmask, h, H, K, kb, NKB, cols, cmask):
    """From a chunk's tiles ``[C, KB]`` of k, ``eG = decay(G)`` and ``eD = decay(G_last - G)`` (fp32): ``k e^G`` and
    ``k e^{G_last - G}``, row-scaled into column block kb."""
    store_prepared(kg_ptr, sg_ptr, k * eG, rows, rmask, h, H, K, kb, NKB, cols, cmask)
    store_prepared(kd_ptr, sd_ptr, k * eD, rows, rmask, h, H, K, kb, NKB, cols, cmask)


@triton.jit
def prepare_kernel(k_ptr, q_ptr, G_ptr, kg_ptr, sg_ptr, kd_ptr, sd_ptr, qg_ptr, sq_ptr, cu_ptr, seq_ptr, start_ptr, H,
                   K, NKB, C: tl.constexpr, KB: tl.constexpr, WITH_Q: tl.constexpr):
    """One chunk, head and state block: ``k e^G``, ``k e^{G_last - G}`` and with ``WITH_Q`` ``q e^G``, row-scaled."""
    t0, n, i, rows, rmask, grows = chunk_rows(tl.program_id(0), cu_ptr, seq_ptr, start_ptr, C)
    h = tl.program_id(1)
    kb = tl.program_id(2)
    cols = kb * KB + tl.arange(0, KB)
    cmask = cols < K
    k = load_tile(k_ptr, rows, rmask, h, H, K, cols, cmask)
    eG, eD = chunk_decays(G_ptr, t0, n, grows, h, H, K, cols, cmask)
    store_key_operands(kg_ptr, sg_ptr, kd_ptr, sd_ptr, k, eG, eD, rows, rmask, h, H, K, kb, NKB, cols, cmask)
    if WITH_Q:
        q = load_tile(q_ptr, rows, rmask, h, H, K, cols, cmask)
        store_prepared(qg_ptr, sq_ptr, q * eG, rows, rmask, h, H, K, kb, NKB, cols, cmask)


class PreparedKeys(NamedTuple):
    """A pass's prepared operands (``[T, H, K]`` in ``operand_dtype``) and their row scales (fp32
    ``[T, H, NSB]``, one a row and column block of ``block``): ``k e^G``, ``k e^{G_last - G}``, and ``q e^G``
    where the pass needs it (None else)."""

    kg: torch.Tensor
    sg: torch.Tensor
    kd: torch.Tensor
    sd: torch.Tensor
    qg: torch.Tensor | None = None
    sq: torch.Tensor | None = None

    @property
    def block(self) -> int:
        """The width ``SB`` of the column blocks that share a row scale."""
        return padded(self.kg.shape[-1]) // self.sg.shape[-1]

    def state_rows(self, width: int) -> int:
        """``KB``, the rows of a pass's state blocks for at most ``width`` of them: each block within one scale
        block (``state.block_scales``)."""
        return state_blocks(self.kg.shape[-1], maximum=min(width, self.block))[0]

    @property
    def constexprs(self) -> dict:
        """What a serial kernel reading these operands takes about their scales (``SB``, ``NSB``)."""
        return dict(SB=self.block, NSB=self.sg.shape[-1])


def allocate_keys(total: int, H: int, K: int, precision: str, device, with_q: bool = False,
                  block: int = SCALE_BLOCK) -> PreparedKeys:
    """Uninitialized ``PreparedKeys`` for ``[total, H, K]`` operands (scales of column blocks at most ``block`` wide),
    with ``q e^G``'s where ``with_q``."""
    NKB = state_blocks(K, maximum=block)[1]

    def operand():
        return (torch.empty(total, H, K, device=device, dtype=operand_dtype(precision)),
                torch.empty(total, H, NKB, device=device, dtype=torch.float32))
    (kg, sg), (kd, sd) = operand(), operand()
    qg, sq = operand() if with_q else (None, None)
    return PreparedKeys(kg, sg, kd, sd, qg, sq)


def prepare_keys(k, G, chunks: Chunks, precision: str, q=None, config: dict | None = None) -> PreparedKeys:
    """The operands of KDA's state passes from k (and q) and the cumulative gate G; ``config`` overrides the launch
    (``num_warps``; ``SB``: the scales' column blocks, ``SCALE_BLOCK`` by default). The op forms them where it
    normalizes q and k (``kda.front``), bitwise these."""
    total, H, K = k.shape
    config = dict(config or {})
    keys = allocate_keys(total, H, K, precision, k.device, q is not None, config.pop("SB", SCALE_BLOCK))
    KB, NKB = state_blocks(K, maximum=keys.block)
    if chunks.num_chunks and H:
        launch(prepare_kernel, (chunks.num_chunks, H, NKB),
               (k, k if q is None else q, G, keys.kg, keys.sg, keys.kd, keys.sd,
                keys.kg if keys.qg is None else keys.qg, keys.sg if keys.sq is None else keys.sq, chunks.cu,
                chunks.seq, chunks.start, H, K, NKB),
               dict(C=chunks.size, KB=KB, WITH_Q=q is not None), [PREPARE_LAUNCH | config])
    return keys
