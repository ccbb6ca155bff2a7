"""The output of a chunk from its entry state, in parallel over chunks: shared by GLA and KDA.

With ``S0 [K, V]`` the entry state of a chunk of C rows (``hs[c]``, written by the op's serial state pass),
``G [C, K]`` its chunk-local cumulative log-decay (``[C]`` broadcast for simple GLA), ``P [C, C]`` its
intra-chunk matrix (scale included, lower triangular) and ``X [C, V]`` the values the chunk writes
(GLA: v; KDA: the delta rule's U):

    O = P X + scale (q e^G) S0                                      [C, V]

One program per chunk, head and value block; nothing here is serial, so a long single sequence gets as
many programs as it has chunks. The same kernel, transposed (``REVERSE``), is GLA's value gradient
``dv = P^T dO + (k e^{G_last - G}) dS1`` with ``dS1`` the gradient of the chunk's exit state.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import Chunks, Selection, launch, padded
from .scaled import Stored, dot_row_scaled, load_tile_scaled_blocks
from .tiles import (
    MIN_BLOCK,
    chunk_rows,
    decay,
    gated_left,
    load_gate,
    load_gate_row,
    load_operand,
    load_tile,
    selected,
    store_tile,
)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which the forward state pass stores the per-chunk entry states ``h`` that the parallel
    kernels read: bf16 for bf16 inputs, fp32 otherwise (fp32 inputs: the precision modes' ground; fp16:
    its range, 65504, cannot hold a state that grows with the sequence where bf16 has fp32's range).
    The pass carries the state in fp32 and rounds only what it stores, so the final state stays fp32 and
    no rounding accumulates along the sequence; the dots against a stored 16-bit state take their other
    operand rounded to it (``state_term``), at twice the tensor-core rate. The stored states are the
    largest traffic of the forward (``[NC, H, K, V]``, 0.5 GB in fp32 at B=8, T=4096, H=16, K=V=128),
    read again by the output pass and the backward: in bf16 the forward took 1.246 -> 1.044 ms (GLA,
    H200), o's error 1.84e-3 -> 2.01e-3 against FLA's 2.53e-3. The reverse pass's ``dh`` stays fp32:
    in bf16 dv's error would reach 2.64e-3 against FLA's 2.68e-3 (interpreted, T=256)."""
    return dtype if dtype == torch.bfloat16 else torch.float32


@triton.jit
def state_term(acc, x_ptr, G_ptr, st_ptr, c, rows, rmask, grows, last, h, H, T, K, V, vv, vmask, scale,
               BK: tl.constexpr, TO_LAST: tl.constexpr, HEAD_FIRST: tl.constexpr, SCALAR: tl.constexpr,
               PREC: tl.constexpr, GATED: tl.constexpr):
    """``acc [C, BV] += (x * scale e^G) S`` (``TO_LAST``: ``e^{G_last - G}``) with ``x [C, K]`` the chunk's
    rows of q or k and ``S = st[c, h, :, vv]`` ``[K, BV]`` a state of chunk c, K in blocks of BK; the
    left operand is rounded to the state's dtype (16-bit states: a 16-bit dot). With ``GATED`` x holds that left
    operand already (``tiles.gated_left``, in the state's dtype) and G is not read."""
    base = st_ptr + (c.to(tl.int64) * H + h) * K * V
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < K
        # S loaded in each branch, where each took it before the gated operand (the ungated form's SASS unchanged)
        if GATED:
            x = load_operand(x_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
            S = tl.load(base + kk[:, None] * V + vv[None, :], mask=kmask[:, None] & vmask[None, :], other=0.0)
        else:
            x = load_tile(x_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
            G = load_gate(G_ptr, grows, grows >= 0, h, H, K, kk, kmask, SCALAR)
            if TO_LAST:
                G = load_gate_row(G_ptr, last, h, H, K, kk, kmask, SCALAR)[None, :] - G
            S = tl.load(base + kk[:, None] * V + vv[None, :], mask=kmask[:, None] & vmask[None, :], other=0.0)
            x = gated_left(x, decay(G), scale, S.dtype)
        acc += tl.dot(x, S, input_precision=PREC)
    return acc


@triton.jit
def output_kernel(x_ptr, y_ptr, y_s_ptr, G_ptr, P_ptr, st_ptr, o_ptr, cu_ptr, seq_ptr, start_ptr, sel_ptr, scale, H, T,
                  K, V, Y_NSB, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HEAD_FIRST: tl.constexpr,
                  SCALAR: tl.constexpr, PREC: tl.constexpr, REVERSE: tl.constexpr, Y_SB: tl.constexpr,
                  ADJACENT: tl.constexpr, GATED: tl.constexpr, SELECT: tl.constexpr):
    """One chunk, value block and head, ``[C, BV]``: ``O = P Y + scale (x e^G) S`` (the output: x = q, Y = v or U,
    S = ``st[c]`` the chunk's entry state), or with ``REVERSE`` ``O = P^T Y + scale (x e^{G_last - G}) S`` (GLA's dv:
    x = k, Y = dO, S = the gradient of the chunk's exit state). Y row-scaled where ``Y_SB`` (its writer's value blocks,
    ``chunk.scaled``; 0: as stored): where they are as wide as this program's, ``P Y`` is an fp16 dot
    (``scaled.dot_row_scaled``: Y is row-scaled only for "tf32" dots, whose significant bits fp16 keeps), else
    Y's fp32 values ``X s`` the right operand of a "tf32" dot. Programs ``(c, h, value block)``, or with
    ``ADJACENT`` ``(c * NVB + value block, h)``: a chunk's value blocks side by side, so that of their reads of its x,
    G and P one comes from memory. ``GATED``: x holds ``scale x e^G`` already, in the states' dtype (``state_term``).
    ``SELECT``: the chunks listed at sel_ptr only (``common.Selection``), program i taking chunk ``sel[i]``."""
    if ADJACENT:
        c = tl.program_id(0) // tl.cdiv(V, BV)
        v0 = tl.program_id(0) % tl.cdiv(V, BV) * BV
    else:
        c = tl.program_id(0)
        v0 = tl.program_id(2) * BV
    c = selected(c, sel_ptr, SELECT)
    h = tl.program_id(1)
    t0, n, i, rows, rmask, grows = chunk_rows(c, cu_ptr, seq_ptr, start_ptr, C)
    vv = v0 + tl.arange(0, BV)
    vmask = vv < V
    P = load_tile(P_ptr, rows, rmask, h, H, C, i, i < C)
    if REVERSE:
        P = tl.trans(P)
    if Y_SB >= BV:
        O = dot_row_scaled(P, y_ptr, y_s_ptr, rows, rmask, h, H, V, v0, vmask, Y_SB, Y_NSB, BV)
    elif Y_SB:
        y = load_tile_scaled_blocks(y_ptr, y_s_ptr, rows, rmask, h, H, V, v0, vmask, Y_SB, Y_NSB, BV)
        O = tl.dot(P, y, input_precision=PREC)
    else:
        O = tl.dot(P, load_tile(y_ptr, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST), input_precision=PREC)
    O = state_term(O, x_ptr, G_ptr, st_ptr, c, rows, rmask, grows, t0 + n - 1, h, H, T, K, V, vv, vmask, scale, BK,
                   REVERSE, HEAD_FIRST, SCALAR, PREC, GATED)
    store_tile(o_ptr, O, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST)


FP16_PRODUCT_BLOCK = 64
"""The narrowest value blocks of a row-scaled Y's writer for which ``output_kernel`` takes ``P Y`` as an fp16 dot, in
value blocks no wider than the writer's, a chunk's value blocks as adjacent programs (``ADJACENT``). Measured on an
H200 (KDA's forward output, bf16, B=8, T=4096, H=16, K=V=128, U written in blocks of 64): 0.371 ms with the "tf32"
dot at value blocks of 128, 0.341 with the fp16 dot at 64, 0.465 with the fp16 dot at 32
(``benchmarks/results/kda_profile_output_h200_session16.txt``). The other products keep the value blocks the slowest
grid axis: adjacent, GLA's dv took 0.603 -> 0.641 ms (simple GLA's 0.513 -> 0.501; B=8,
``gla_kernels_output_grid_h200_session16.txt``)."""


def state_term_ladder(K: int, V: int, C: int) -> list[dict]:
    """Launch ladder of ``output_kernel`` (the output, and GLA's dv): 8 warps,
    BK = 64 (C = 64) or 32 (C = 128), value blocks of 64, at which neither spills on sm_90 for K = V = 128
    with fp32 states (Triton 3.6; at 4 warps and C = 64: 440 and 456 B of stack); the narrowest blocks last."""
    cfg = dict(BK=min(padded(K, MIN_BLOCK), 64 if C == 64 else 32), BV=min(padded(V, MIN_BLOCK), 64), num_warps=8,
               num_stages=1)
    return [cfg, cfg | dict(BK=MIN_BLOCK, BV=MIN_BLOCK)]


def output_ladder(K: int, V: int, C: int, hs_dtype: torch.dtype, gated: bool = False) -> list[dict]:
    """Launch ladder of ``output_kernel``: all of V (up to 128) in one program, BK = 32 and 4 warps where
    the stored states are 16-bit and C = 64 (q and G read once, not once per value block), else
    ``state_term_ladder``. Measured on an H200 (bf16, B=8, T=4096, H=16, K=V=128, the forward's state pass
    with the output, ``benchmarks/results/gla_profile_h200.json``): GLA 1.044 ms (value blocks of 64, 8
    warps) -> 0.911, simple GLA 0.692 -> 0.616; with fp32 states all of V was slower (1.55-1.78 vs
    1.47 ms, ``gla_profile_h100.json``). With its left operand ``gated`` (no G, no exponentials) BK = 64:
    KDA's output 0.278 -> 0.244 ms (H200, B=8; ``results/kda_profile_gated_q_h200_session19.txt``)."""
    wide = hs_dtype != torch.float32 and C == 64
    bk = min(padded(K, MIN_BLOCK), 64) if gated else MIN_BLOCK
    return [dict(BK=bk, BV=min(padded(V, MIN_BLOCK), 128), num_warps=4, num_stages=1),
            *state_term_ladder(K, V, C)] if wide else state_term_ladder(K, V, C)


def chunk_products(x, y: torch.Tensor | Stored, G, P, st, out, chunks: Chunks, H: int, T: int, scale: float,
                   head_first: bool, scalar: bool, precision: str, ladder: list[dict], reverse: bool = False,
                   gated: bool = False, select: Selection | None = None):
    """``output_kernel`` over every chunk (``select``: its chunks) into ``out`` (like y; y row-scaled where a
    ``Stored`` with scales, then sequence-first; where its writer's blocks are at least ``FP16_PRODUCT_BLOCK`` wide,
    the value blocks no wider than them), on the first step of ``ladder`` that fits; ``gated``: x is ``scale x e^G``
    (``tiles.gated_left``) in st's dtype."""
    y = y if isinstance(y, Stored) else Stored(y)
    assert not (y.scaled and head_first), "row-scaled values are sequence-first"
    assert not gated or (x.dtype == st.dtype and not reverse), "a gated x is the forward's, in the states' dtype"
    fp16 = y.scaled and y.block >= FP16_PRODUCT_BLOCK
    ladder = [cfg | dict(ADJACENT=fp16) | (dict(BV=min(cfg["BV"], y.block)) if fp16 else {}) for cfg in ladder]

    NC = chunks.num_chunks if select is None else select.num_chunks

    def grid(meta: dict) -> tuple[int, int, int]:
        nvb = triton.cdiv(y.data.shape[-1], meta["BV"])
        return (NC * nvb, H, 1) if meta["ADJACENT"] else (NC, H, nvb)
    if NC and H:
        launch(output_kernel, grid,
               (x, y.data, y.scale_ptr(), G, P, st, out, chunks.cu, chunks.seq, chunks.start,
                chunks.seq if select is None else select.chunks, scale, H, T, x.shape[-1], y.data.shape[-1], y.blocks),
               dict(C=chunks.size, HEAD_FIRST=head_first, SCALAR=scalar, PREC=precision, REVERSE=reverse,
                    Y_SB=y.block if y.scaled else 0, GATED=gated, SELECT=select is not None), ladder)
    return out


def output(q, x: torch.Tensor | Stored, G, P, hs, chunks: Chunks, H: int, T: int, scale: float, head_first: bool,
           scalar: bool, precision: str, config: dict | None = None, gated_q: torch.Tensor | None = None,
           select: Selection | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``O`` of every chunk, like x (``[tokens, H, V]`` or head-first; a ``Stored``: KDA's U, row-scaled under "tf32")
    in q's dtype; ``config`` replaces ``output_ladder`` (``benchmarks/gla.py --profile``).
    ``gated_q``: ``scale q e^G`` in hs's dtype (``tiles.gated_left``; KDA's ``prepared.prepare_keys`` forms it where it
    reads G), read in place of q and G: 256 bytes a token and head where q and G took 768 (bf16, K=128).
    ``select``: the chunks of a ``Selection`` only, into ``out`` (as returned; the other chunks' rows left as they are)."""
    o = torch.empty(*(x.data if isinstance(x, Stored) else x).shape, device=q.device, dtype=q.dtype) if out is None \
        else out
    ladder = [config] if config else output_ladder(q.shape[-1], o.shape[-1], chunks.size, hs.dtype, gated_q is not None)
    return chunk_products(q if gated_q is None else gated_q, x, G, P, hs, o, chunks, H, T, scale, head_first, scalar,
                          precision, ladder, gated=gated_q is not None, select=select)
