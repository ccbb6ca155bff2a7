"""The forward's front: the cumulative gate, q and k normalized and the operands that the serial pass reads, in one pass.

One program per chunk of C tokens, head and column block of ``KB`` channels (the prepared operands' scale blocks,
``chunk.prepared``), from q, k and the log-decay g as given, with ``r = (sum_d x_d^2 + eps)^{-1/2}`` over a row's K
channels (``l2norm``):

    G      = the chunk-local cumulative sum of g   fp32 (``gate.chunk_cumsum``; given instead for fp32 inputs, whose G
                                                 is fp64, and for the gate's function in the kernel: ``gate.gate_cumsum``)
    qn, kn = q r_q, k r_k               in q's dtype (``use_qk_l2norm``; else q and k as given, not copied)
    kg, kd = kn e^G, kn e^{G_last - G}   row-scaled (``prepared.decays``, ``prepared.store_key_operands``)
    qg     = qn e^G                      row-scaled (``prepared.store_prepared``): the output's state term's left
                                         operand (``chunk_fwd.recurrence``'s ``output``)
    flags  = the sub-chunks whose decay the diagonal blocks' dots cannot take (``blocks.span_flags``; without
             safe_gate), for ``intra``

G, qn and kn are stored for ``intra``, the serial pass and the backward; kg, kd and qg are formed from them as stored
(qn and kn rounded to q's dtype first, G read back), so they are bitwise what ``prepare_keys`` forms from the stored
G, qn and kn. Formed apart (``l2norm.l2norm_forward`` twice, then the operands), qn and kn were written
and read back: measured on an H200 (bf16, B=8, T=4096, H=16, K=V=128), 0.137 + 0.266 ms apart, 0.340 here.
G is summed by tensor-core dots (``tl.cumsum`` over the rows of this kernel's ``[64, 128]`` tiles, spread over its 8
warps, took 0.34 ms more, at b8b3fd7), stored, and read back after a barrier: held in
registers through the rest, the sum's tile took the kernel from 128 to 203 registers (one program an SM) and 0.745 ms,
0.590 at most 128 (spilling); read back, 0.409 against 0.335 + 0.111 for this kernel and ``gate_cumsum`` apart (the
forward 1.456 -> 1.416 ms, at 21ae95c).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..chunk.prepared import (
    PREPARE_LAUNCH,
    SCALE_BLOCK,
    PreparedKeys,
    allocate_keys,
    decays,
    store_key_operands,
    store_prepared,
)
from ..chunk.state import state_blocks
from ..chunk.tiles import chunk_rows, load_gate, load_gate_row, load_tile, store_tile, tile_ptrs
from ..common import Chunks, launch
from .blocks import NB, span_flags
from .gate import chunk_cumsum
from .l2norm import EPS, inverse_norm

FRONT_LAUNCH = PREPARE_LAUNCH
"""As ``prepare_kernel``'s, whose tiles and stores it forms with q's and the norms: measured on an H200 (bf16, B=8,
T=4096, H=16, K=128) 0.340 ms at 8 warps (128 registers), 0.340 at 16, 0.536 at 4; two load stages 0.340. With G
summed in it: 0.412 at 8 warps (128 registers), 0.511 at 16, 0.726 at 4, 0.412 at two load stages."""


@triton.jit
def sum_squares(x_ptr, x, rows, rmask, h, H, K, KB: tl.constexpr, NKB: tl.constexpr):
    """Each row's sum of squares over its K channels ``[C]``: of the program's tile x ``[C, KB]`` where it holds them
    all (``NKB == 1``), else of the row's column blocks loaded in their order, so that every program of a row sums
    alike."""
    if NKB == 1:
        ss = tl.sum(x * x, axis=1)
    else:
        ss = tl.zeros((x.shape[0],), tl.float32)
        for b in tl.static_range(NKB):
            cols = b * KB + tl.arange(0, KB)
            y = load_tile(x_ptr, rows, rmask, h, H, K, cols, cols < K)
            ss += tl.sum(y * y, axis=1)
    return ss


@triton.jit
def normalized(x_ptr, out_ptr, rows, rmask, h, H, K, cols, cmask, eps, KB: tl.constexpr, NKB: tl.constexpr,
               L2NORM: tl.constexpr):
    """The program's fp32 tile of x as the forward's kernels read it: with ``L2NORM`` ``x r`` stored into out_ptr
    (in its dtype) and returned as stored; else x."""
    x = load_tile(x_ptr, rows, rmask, h, H, K, cols, cmask)
    if L2NORM:
        y = (x * inverse_norm(sum_squares(x_ptr, x, rows, rmask, h, H, K, KB, NKB), eps)[:, None]).to(
            out_ptr.dtype.element_ty)
        store_tile(out_ptr, y, rows, rmask, h, H, K, cols, cmask)
        x = y.to(tl.float32)
    return x


@triton.jit
def store_chunk_gate(g_ptr, G_ptr, rows, rmask, h, H, K, cols, cmask, C: tl.constexpr):
    """A chunk's cumulative gate tile ``[C, KB]`` (fp32) from g as stored (``gate.chunk_cumsum``), stored into G, then a
    barrier: the program's threads read it back (``front_kernel``) where others wrote it."""
    x = tl.load(tile_ptrs(g_ptr, rows, h, H, K, cols), mask=rmask[:, None] & cmask[None, :], other=0.0)
    store_tile(G_ptr, chunk_cumsum(x, C), rows, rmask, h, H, K, cols, cmask)
    tl.debug_barrier()


@triton.jit
def front_kernel(q_ptr, k_ptr, g_ptr, G_ptr, qn_ptr, kn_ptr, kg_ptr, sg_ptr, kd_ptr, sd_ptr, qg_ptr, sq_ptr, flag_ptr,
                 cu_ptr, seq_ptr, start_ptr, eps, H, K, C: tl.constexpr, KB: tl.constexpr, NKB: tl.constexpr,
                 L2NORM: tl.constexpr, CUMSUM: tl.constexpr, FLAGS: tl.constexpr):
    """One chunk, head and column block: with ``CUMSUM`` G from g (``store_chunk_gate``), with ``FLAGS`` the sub-chunks
    whose decay the diagonal blocks' dots cannot take (``blocks.span_flags``); kn and k's operands, then qn and its
    operand (the module docstring)."""
    c = tl.program_id(0)
    t0, n, i, rows, rmask, grows = chunk_rows(c, cu_ptr, seq_ptr, start_ptr, C)
    h = tl.program_id(1)
    kb = tl.program_id(2)
    cols = kb * KB + tl.arange(0, KB)
    cmask = cols < K
    if CUMSUM:
        store_chunk_gate(g_ptr, G_ptr, rows, rmask, h, H, K, cols, cmask, C)
    G = load_gate(G_ptr, grows, grows >= 0, h, H, K, cols, cmask)
    if FLAGS:
        span_flags(G, G_ptr, flag_ptr, c, t0, n, h, H, K, cols, cmask, C, C // NB)
    eG, eD = decays(G, load_gate_row(G_ptr, t0 + n - 1, h, H, K, cols, cmask))
    k = normalized(k_ptr, kn_ptr, rows, rmask, h, H, K, cols, cmask, eps, KB, NKB, L2NORM)
    store_key_operands(kg_ptr, sg_ptr, kd_ptr, sd_ptr, k, eG, eD, rows, rmask, h, H, K, kb, NKB, cols, cmask)
    q = normalized(q_ptr, qn_ptr, rows, rmask, h, H, K, cols, cmask, eps, KB, NKB, L2NORM)
    store_prepared(qg_ptr, sq_ptr, q * eG, rows, rmask, h, H, K, kb, NKB, cols, cmask)


class Front(NamedTuple):
    """What the forward's front forms (``[T, H, K]`` each): q and k as the forward reads them (normalized, or as
    given), the serial pass's prepared operands (``k e^G``, ``k e^{G_last - G}`` and ``q e^G``, ``chunk.prepared``) and
    the cumulative gate G; and without safe_gate the sub-chunks flagged for exact sums (int32 ``[NC, H]``,
    ``blocks.span_flags``; else None)."""

    q: torch.Tensor
    k: torch.Tensor
    keys: PreparedKeys
    G: torch.Tensor
    flags: torch.Tensor | None


def front(q, k, g, l2norm: bool, chunks: Chunks, precision: str, safe: bool, config: dict | None = None,
          G: torch.Tensor | None = None) -> Front:
    """The forward's front from tokens-flattened q and k ``[T, H, K]`` (any kernel dtype, read as they are) and the
    log-decay g ``[T, H, K]`` (any kernel dtype), whose fp32 cumulative gate it forms (``store_chunk_gate``), or ``G``
    given (``gate.gate_cumsum``: an fp64 G, or the gate's function formed first; g is not read then, and may be None);
    ``safe``: safe_gate's promise (no flags). ``config`` overrides the launch (``num_warps``, ``num_stages``)."""
    total, H, K = k.shape
    qn, kn = (torch.empty_like(q), torch.empty_like(k)) if l2norm else (q, k)
    keys = allocate_keys(total, H, K, precision, k.device, with_q=True)
    cumsum = G is None
    G = torch.empty(k.shape, device=k.device, dtype=torch.float32) if G is None else G
    flags = None if safe else torch.zeros(chunks.num_chunks, H, device=k.device, dtype=torch.int32)
    KB, NKB = state_blocks(K, maximum=SCALE_BLOCK)
    if chunks.num_chunks and H:
        launch(front_kernel, (chunks.num_chunks, H, NKB),
               (q, k, G if g is None else g, G, qn, kn, keys.kg, keys.sg, keys.kd, keys.sd, keys.qg, keys.sq,
                G if flags is None else flags, chunks.cu, chunks.seq, chunks.start, EPS, H, K),
               dict(C=chunks.size, KB=KB, NKB=NKB, L2NORM=l2norm, CUMSUM=cumsum, FLAGS=not safe),
               [FRONT_LAUNCH | (config or {})])
    return Front(qn, kn, keys, G, flags)
