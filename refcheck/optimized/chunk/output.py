"""GLA's output of a chunk from its entry state, in parallel over chunks.

With ``S0 [K, V]`` the entry state of a chunk of C rows (``hs[c]``, written by the serial state pass),
``G [C, K]`` its chunk-local cumulative log-decay (``[C]`` broadcast for simple GLA), ``P [C, C]`` its
intra-chunk matrix (scale included, lower triangular) and ``V [C, V]`` its values:

    O = P V + scale (q e^G) S0                                      [C, V]

One program per chunk, head and value block; nothing here is serial, so a long single sequence gets as
many programs as it has chunks. The same kernel, transposed (``REVERSE``), is GLA's value gradient
``dv = P^T dO + (k e^{G_last - G}) dS1`` with ``dS1`` the gradient of the chunk's exit state. KDA forms its
output in its serial pass instead (``kda.chunk_fwd.recurrence``), where U, the values its chunks write, is formed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import Chunks, launch, padded
from .tiles import MIN_BLOCK, chunk_rows, decay, gated_left, load_gate, load_gate_row, load_tile, store_tile


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
               PREC: tl.constexpr):
    """``acc [C, BV] += (x * scale e^G) S`` (``TO_LAST``: ``e^{G_last - G}``) with ``x [C, K]`` the chunk's
    rows of q or k and ``S = st[c, h, :, vv]`` ``[K, BV]`` a state of chunk c, K in blocks of BK; the
    left operand is rounded to the state's dtype (16-bit states: a 16-bit dot, ``tiles.gated_left``)."""
    base = st_ptr + (c.to(tl.int64) * H + h) * K * V
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < K
        x = load_tile(x_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
        G = load_gate(G_ptr, grows, grows >= 0, h, H, K, kk, kmask, SCALAR)
        if TO_LAST:
            G = load_gate_row(G_ptr, last, h, H, K, kk, kmask, SCALAR)[None, :] - G
        S = tl.load(base + kk[:, None] * V + vv[None, :], mask=kmask[:, None] & vmask[None, :], other=0.0)
        acc += tl.dot(gated_left(x, decay(G), scale, S.dtype), S, input_precision=PREC)
    return acc


@triton.jit
def output_kernel(x_ptr, y_ptr, G_ptr, P_ptr, st_ptr, o_ptr, cu_ptr, seq_ptr, start_ptr, scale, H, T, K, V,
                  C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HEAD_FIRST: tl.constexpr, SCALAR: tl.constexpr,
                  PREC: tl.constexpr, REVERSE: tl.constexpr):
    """One chunk, head and value block, ``[C, BV]``: ``O = P Y + scale (x e^G) S`` (the output: x = q, Y = v,
    S = ``st[c]`` the chunk's entry state), or with ``REVERSE`` ``O = P^T Y + scale (x e^{G_last - G}) S`` (dv:
    x = k, Y = dO, S = the gradient of the chunk's exit state)."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    vmask = vv < V
    t0, n, i, rows, rmask, grows = chunk_rows(c, cu_ptr, seq_ptr, start_ptr, C)
    P = load_tile(P_ptr, rows, rmask, h, H, C, i, i < C)
    if REVERSE:
        P = tl.trans(P)
    O = tl.dot(P, load_tile(y_ptr, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST), input_precision=PREC)
    O = state_term(O, x_ptr, G_ptr, st_ptr, c, rows, rmask, grows, t0 + n - 1, h, H, T, K, V, vv, vmask, scale, BK,
                   REVERSE, HEAD_FIRST, SCALAR, PREC)
    store_tile(o_ptr, O, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST)


def state_term_ladder(K: int, V: int, C: int) -> list[dict]:
    """Launch ladder of ``output_kernel`` (the output, and GLA's dv): 8 warps,
    BK = 64 (C = 64) or 32 (C = 128), value blocks of 64, at which neither spills on sm_90 for K = V = 128
    with fp32 states (Triton 3.6; at 4 warps and C = 64: 440 and 456 B of stack); the narrowest blocks last."""
    cfg = dict(BK=min(padded(K, MIN_BLOCK), 64 if C == 64 else 32), BV=min(padded(V, MIN_BLOCK), 64), num_warps=8,
               num_stages=1)
    return [cfg, cfg | dict(BK=MIN_BLOCK, BV=MIN_BLOCK)]


def output_ladder(K: int, V: int, C: int, hs_dtype: torch.dtype) -> list[dict]:
    """Launch ladder of ``output_kernel``: all of V (up to 128) in one program, BK = 32 and 4 warps where
    the stored states are 16-bit and C = 64 (q and G read once, not once per value block), else
    ``state_term_ladder``. Measured on an H200 (bf16, B=8, T=4096, H=16, K=V=128, the forward's state pass
    with the output, ``benchmarks/results/gla_profile_h200.json``): GLA 1.044 ms (value blocks of 64, 8
    warps) -> 0.911, simple GLA 0.692 -> 0.616; with fp32 states all of V was slower (1.55-1.78 vs
    1.47 ms, ``gla_profile_h100.json``)."""
    wide = hs_dtype != torch.float32 and C == 64
    return [dict(BK=MIN_BLOCK, BV=min(padded(V, MIN_BLOCK), 128), num_warps=4, num_stages=1),
            *state_term_ladder(K, V, C)] if wide else state_term_ladder(K, V, C)


def chunk_products(x, y, G, P, st, out, chunks: Chunks, H: int, T: int, scale: float, head_first: bool, scalar: bool,
                   precision: str, ladder: list[dict], reverse: bool = False):
    """``output_kernel`` over every chunk into ``out`` (like y), on the first step of ``ladder`` that fits."""
    if chunks.num_chunks and H:
        launch(output_kernel, lambda meta: (chunks.num_chunks, H, triton.cdiv(y.shape[-1], meta["BV"])),
               (x, y, G, P, st, out, chunks.cu, chunks.seq, chunks.start, scale, H, T, x.shape[-1], y.shape[-1]),
               dict(C=chunks.size, HEAD_FIRST=head_first, SCALAR=scalar, PREC=precision, REVERSE=reverse), ladder)
    return out


def output(q, v, G, P, hs, chunks: Chunks, H: int, T: int, scale: float, head_first: bool, scalar: bool,
           precision: str, config: dict | None = None) -> torch.Tensor:
    """``O`` of every chunk, like v (``[tokens, H, V]`` or head-first) in q's dtype; ``config`` replaces
    ``output_ladder`` (``benchmarks/gla.py --profile``)."""
    o = torch.empty(*v.shape, device=q.device, dtype=q.dtype)
    ladder = [config] if config else output_ladder(q.shape[-1], o.shape[-1], chunks.size, hs.dtype)
    return chunk_products(q, v, G, P, hs, o, chunks, H, T, scale, head_first, scalar, precision, ladder)
