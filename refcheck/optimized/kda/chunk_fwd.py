"""Chunked KDA forward: the intra-chunk WY factors, then the state recurrence fused with the output.

Per head, a chunk of C rows (tokens) starts from state ``S0 [K, V]``. With ``G`` the chunk-local
cumulative log-decay ``[C, K]``, ``Kg = k e^G``, ``Qg = scale q e^G``, ``Kd = k e^{G_last - G}``,
``gamma = e^{G_last}``:

    A_ij = sum_d k_id k_jd e^{G_id - G_jd}  (j < i),    L = Diag(beta) A,    T = (I + L)^{-1}
    P_ij = scale sum_d q_id k_jd e^{G_id - G_jd}  (j <= i)
    U  = T Diag(beta) (V - Kg S0)        (the values the delta rule writes, ``[C, V]``)
    O  = Qg S0 + P U
    S1 = Diag(gamma) S0 + Kd^T U

``intra`` computes T and P for every chunk in parallel (``[T, H, C]`` fp32, row t of a chunk holds its
row of the chunk matrix); ``recurrence`` walks the chunks of each sequence in order, one program per
(value block, sequence, head), keeping S in registers, and writes the entry state of every chunk
(``h [NC, H, K, V]``) and U (``[T, H, V]``); O of every chunk then follows from them in parallel
(``chunk.output``, GLA's output with U for v). The serial pass carries only what is serial: with O in
it, each of its programs did the output's two dots too, and a long single sequence has few programs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..chunk.state import launch_serial, load_blocks, read_blocks, serial_chunk, serial_program, store_blocks, write_blocks
from ..chunk.tiles import chunk_span, load_rowvec, load_tile, store_tile
from ..common import Chunks, launch, padded
from .subchunk import chunk_pairs, diag_precision, unit_lower_inverse

CHUNK = 64
SUB = 16


@triton.jit
def intra_kernel(q_ptr, k_ptr, G_ptr, beta_ptr, T_ptr, P_ptr, cu_ptr, seq_ptr, start_ptr, scale, H, K,
                 C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, SAFE: tl.constexpr,
                 USE_GATHER: tl.constexpr, PREC: tl.constexpr, DPREC: tl.constexpr):
    """One chunk and head: ``T = (I + Diag(beta) A)^{-1}`` and ``P`` (scale included)."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    i = tl.arange(0, C)
    rows = t0 + i
    rmask = i < n
    grows = t0 + tl.minimum(i, n - 1)
    stride = H * K
    base = (t0.to(tl.int64) * H + h) * K
    ck = tl.arange(0, BK)
    A = tl.zeros((C, C), tl.float32)
    P = tl.zeros((C, C), tl.float32)
    for k0 in range(0, K, BK):
        cmask = k0 + ck < K
        k = load_tile(k_ptr + k0, rows, rmask, h, H, K, ck, cmask)
        q = load_tile(q_ptr + k0, rows, rmask, h, H, K, ck, cmask)
        G = load_tile(G_ptr + k0, grows, i < C, h, H, K, ck, cmask)
        A, P = chunk_pairs(A, P, k, q, G, k_ptr + base + k0, G_ptr + base + k0, stride, ck, cmask, n, C, BC,
                           SAFE, USE_GATHER, PREC, DPREC)
    beta = load_rowvec(beta_ptr, rows, rmask, h, H)
    T = unit_lower_inverse(beta[:, None] * A, C, BC, PREC, DPREC)
    cc = tl.arange(0, C)
    all_c = cc < C
    store_tile(T_ptr, T, rows, rmask, h, H, C, cc, all_c)
    store_tile(P_ptr, P * scale, rows, rmask, h, H, C, cc, all_c)


@triton.jit
def recurrence_kernel(k_ptr, v_ptr, G_ptr, beta_ptr, T_ptr, h0_ptr, ht_ptr, hs_ptr, u_ptr, cu_ptr, off_ptr, H, K, V,
                      C: tl.constexpr, KB: tl.constexpr, NKB: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                      STORE_FINAL: tl.constexpr, PREC: tl.constexpr):
    """One value block, sequence and head: walk the chunks, the state in NKB blocks S0..S3 [KB, BV];
    ``hs[c] = S0`` (in hs's dtype) and U of every chunk (fp32)."""
    nh, h, bos, eos, c_first, vv, vmask = serial_program(cu_ptr, off_ptr, H, V, BV)
    cc = tl.arange(0, C)
    S0, S1, S2, S3 = load_blocks(h0_ptr, nh, K, V, KB, NKB, BV, vv, vmask, HAS_H0)
    for it in range(tl.cdiv(eos - bos, C)):
        t0, rows, rmask, grows, last = serial_chunk(bos, eos, it, C)
        store_blocks(hs_ptr, S0, S1, S2, S3, (c_first + it) * H + h, K, V, KB, NKB, vv, vmask)
        Z = read_blocks(S0, S1, S2, S3, load_tile(v_ptr, rows, rmask, h, H, V, vv, vmask), k_ptr, G_ptr, rows, rmask,
                        grows, h, H, K, KB, NKB, PREC)
        beta = load_rowvec(beta_ptr, rows, rmask, h, H)
        T = load_tile(T_ptr, rows, rmask, h, H, C, cc, cc < C)
        U = tl.dot(T, beta[:, None] * Z, input_precision=PREC)
        store_tile(u_ptr, U, rows, rmask, h, H, V, vv, vmask)
        S0, S1, S2, S3 = write_blocks(S0, S1, S2, S3, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, KB, NKB,
                                      PREC)
    if STORE_FINAL:
        store_blocks(ht_ptr, S0, S1, S2, S3, nh, K, V, KB, NKB, vv, vmask)


def intra(q, k, G, beta, chunks: Chunks, scale: float, safe: bool, use_gather: bool, precision: str,
          config: dict | None = None):
    """``(T, P)``, fp32 ``[T, H, C]`` each: the inverse factor and the scaled Aqk of every chunk.
    ``config`` overrides the launch (``BK``, ``num_warps``, ``num_stages``)."""
    total, H, K = k.shape
    # loads double-buffered on the general path only: measured on an H200 (bf16, B=8, T=4096, H=16, K=128,
    # ``benchmarks/kda.py --profile``) 1.531 -> 1.443 ms, where the safe path loses (1.580 -> 1.669)
    cfg = dict(BK=min(padded(K), 32), num_warps=4, num_stages=1 if safe else 2) | (config or {})
    T = torch.empty(total, H, chunks.size, device=k.device, dtype=torch.float32)
    P = torch.empty_like(T)
    if chunks.num_chunks and H:
        launch(intra_kernel, (chunks.num_chunks, H),
               (q, k, G, beta, T, P, chunks.cu, chunks.seq, chunks.start, scale, H, K),
               dict(C=chunks.size, BC=SUB, SAFE=safe, USE_GATHER=use_gather, PREC=precision,
                    DPREC=diag_precision(precision)),
               [cfg, cfg | dict(num_stages=1), cfg | dict(BK=min(cfg["BK"], 16), num_stages=1)])
    return T, P


def recurrence(k, v, G, beta, T, initial_state, chunks: Chunks, precision: str, *, final: bool,
               hs_dtype: torch.dtype = torch.float32, config: dict | None = None):
    """Walk the chunks. Returns ``(final state, h, U)``: the fp32 final state ``[N, H, K, V]`` (None
    unless ``final``), the entry states h ``[NC, H, K, V]`` in ``hs_dtype`` and U ``[T, H, V]`` fp32.
    ``config`` overrides the launch (``BV``, ``num_warps``, ``num_stages``)."""
    total, H, K = k.shape
    V = v.shape[-1]
    dev = k.device
    ht = torch.empty(chunks.num_seqs, H, K, V, device=dev, dtype=torch.float32) if final else None
    hs = torch.empty(chunks.num_chunks, H, K, V, device=dev, dtype=hs_dtype)
    U = torch.empty(total, H, V, device=dev, dtype=torch.float32)
    launch_serial(recurrence_kernel,
                  (k, v, G, beta, T, initial_state if initial_state is not None else hs, ht if final else hs, hs, U,
                   chunks.cu, chunks.offsets, H, K, V),
                  dict(HAS_H0=initial_state is not None, STORE_FINAL=final, PREC=precision), chunks, H, K, V, config)
    return ht, hs, U
