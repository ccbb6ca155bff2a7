"""Chunked GLA and simple GLA in Triton: the kernels and their launchers.

Per sequence and head the state ``S [K, V]`` follows ``S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T`` and
``o_t = scale S_t^T q_t`` (simple GLA: one decay per token, broadcast over K). A chunk of C rows
(tokens) starts from the state ``S0``; with ``G [C, K]`` the chunk-local cumulative log-decay
(``[C]`` broadcast for simple GLA):

    P_ij = scale sum_d q_id k_jd exp(G_id - G_jd)   (j <= i; simple GLA: scale (q k^T)_ij exp(G_i - G_j))
    O    = scale (q e^G) S0 + P V                                   [C, V]
    S1   = Diag(e^{G_last}) S0 + (k e^{G_last - G})^T V             [K, V]

Forward: ``chunk_cumsum`` (G), ``intra`` (P of every chunk, in parallel), ``states`` (one program per
value block, K-block, sequence and head walks the chunks with its rows of S in registers and writes the
entry state ``h [NC, H, K, V]`` of every chunk (in ``chunk.output.state_dtype``) and the final state;
the update is KDA's ``chunk.state`` with the written values ``U = V``, its rows independent under GLA's
diagonal decay), then ``chunk.output`` (O of every chunk from P, V and h, in parallel, the kernel KDA's
output shares: the serial pass carries only the state update).

Backward, with ``dS1`` the gradient of a chunk's exit state (``dh``) and ``dP = lower(dO V^T)``:

    dS0 = Diag(e^{G_last}) dS1 + scale (q e^G)^T dO                 (``dstate``, last chunk first)
    dq  = scale e^G (dO S0^T) + scale rowform(dP, k)                (``grads_qk``)
    dk  = e^{G_last - G} (V dS1^T) + scale colform(dP, q)
    dv  = P^T dO + (k e^{G_last - G}) dS1                           (``chunk.output``, transposed)
    dG  = q dq - k dk, plus on the last row sum_j k_j e^{G_last - G_j} (V dS1^T)_j + e^{G_last} rowsum(S0 dS1)
    dg  = the reverse cumulative sum of dG within the chunk (the adjoint of the cumulative sum;
          simple GLA first sums dG over the channels)

rowform / colform are ``pairs.rowform`` / ``pairs.colform`` (safe for any decay); for simple GLA
``(dP * D) k`` and ``(dP * D)^T q`` with ``D_ij = exp(G_i - G_j)`` (j <= i), single dots.

Layouts: q, k, v, g, o and their gradients are sequence-first ``[B, T, H, D]`` or head-first
``[B, H, T, D]`` (``HEAD_FIRST``, see ``chunk.tiles``); G, P and the partial gate gradients are
sequence-first intermediates (G in ``tiles.cumulative_gate_dtype``, the rest fp32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..chunk.output import chunk_products, state_dtype, state_term_ladder
from ..chunk.output import output as chunk_output
from ..chunk.state import (
    dwrite_blocks,
    fills_gpu,
    launch_serial,
    load_blocks,
    serial_chunk,
    serial_program,
    store_blocks,
    write_blocks,
)
from ..chunk.tiles import (
    MIN_BLOCK,
    chunk_rows,
    chunk_span,
    decay,
    load_gate,
    load_gate_row,
    load_operand,
    load_tile,
    row_offsets,
    store_tile,
)
from ..common import Chunks, launch, padded
from ..kda.subchunk import diag_precision
from .pairs import colform, gram, rowform

SUB = 16
CHUNK_SIZES = (64, 128)
def split_by_k_block(split_k: bool | None, chunks: Chunks, H: int, V: int) -> bool:
    """Whether a state pass runs one program per 64-row K-block of the state (GLA's state rows evolve
    independently: its decay is diagonal) as well as per value block, sequence and head: ``split_k``, or
    where it is None, only when the unsplit launch would leave SMs idle (``fills_gpu``). Measured on an
    H100 (``benchmarks/results/gla_profile_h100.json``, bf16, H=16, K=V=128, ms): at B=8 T=4096 (256
    unsplit programs) unsplit is faster, GLA's forward state pass with the output 1.33 vs 1.49 and its
    reverse pass 0.55 vs 0.82, simple GLA's 1.07 vs 1.22 and 0.43 vs 0.60; at B=1 T=32768 (64 unsplit
    programs of 32 values) split is, GLA 2.49 vs 3.45 and 1.38 vs 2.05, simple GLA 1.58 vs 1.79 and
    0.91 vs 1.14."""
    return split_k if split_k is not None else not fills_gpu(V, chunks.num_seqs * H)


@triton.jit
def cumsum_kernel(x_ptr, y_ptr, cu_ptr, seq_ptr, start_ptr, H, T, D, NPART, TOTAL, C: tl.constexpr,
                  BD: tl.constexpr, X_HF: tl.constexpr, Y_HF: tl.constexpr, REVERSE: tl.constexpr):
    """One chunk and head: ``y = cumsum(sum_p x[p])`` over the chunk's rows (from its end with
    ``REVERSE``), summed in fp64 where y is fp64 (``tiles.cumulative_gate_dtype``) and in fp32 otherwise (a
    16-bit y, the gate's gradient, is rounded only when stored); x has ``NPART`` parts of ``TOTAL`` tokens;
    both ``[*, H, D]`` in their layouts."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    i = tl.arange(0, C)
    rows = t0 + i
    rmask = i < n
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        cmask = cols < D
        x = tl.zeros((C, BD), tl.float64 if y_ptr.dtype.element_ty == tl.float64 else tl.float32)
        for p in range(NPART):
            x += load_tile(x_ptr + p * TOTAL * H * D, rows, rmask, h, H, D, cols, cmask, T, X_HF).to(x.dtype)
        store_tile(y_ptr, tl.cumsum(x, axis=0, reverse=REVERSE), rows, rmask, h, H, D, cols, cmask, T, Y_HF)


@triton.jit
def scalar_decays(G_ptr, grows, h, H, C: tl.constexpr):
    """``D_ij = exp(G_i - G_j)`` for j <= i, 0 above (simple GLA's chunk decays, ``[C, C]``). An fp64 gate
    is split into fp32 parts ``hi + lo`` on its ``[C]`` rows and the difference taken as
    ``(hi_i - hi_j) + (lo_i - lo_j)`` (exact to the difference's own rounding: two nearby ``hi`` subtract
    exactly), so that no ``[C, C]`` tile is fp64: on an H200 (Triton 3.6) the fp64 tile, feeding the
    gradient dots directly and transposed, gave dq and dk wrong by up to 0.66 in ``grads_qk_kernel``
    (the same code in ``intra_kernel`` computed right; the interpreter computes both right)."""
    i = tl.arange(0, C)
    Gv = tl.load(G_ptr + row_offsets(grows, h, H, 1))
    hi = Gv.to(tl.float32)
    d = hi[:, None] - hi[None, :]
    if G_ptr.dtype.element_ty == tl.float64:
        lo = (Gv - hi.to(tl.float64)).to(tl.float32)
        d += lo[:, None] - lo[None, :]
    return tl.exp(tl.where(i[:, None] >= i[None, :], d, float("-inf")))


@triton.jit
def intra_kernel(q_ptr, k_ptr, G_ptr, P_ptr, cu_ptr, seq_ptr, start_ptr, scale, H, T, K, C: tl.constexpr,
                 BC: tl.constexpr, BK: tl.constexpr, HEAD_FIRST: tl.constexpr, SCALAR: tl.constexpr,
                 PREC: tl.constexpr, DPREC: tl.constexpr):
    """One chunk and head: ``P`` (scale included), fp32 ``[T, H, C]``."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    t0, n, i, rows, rmask, grows = chunk_rows(c, cu_ptr, seq_ptr, start_ptr, C)
    k_row0 = k_ptr + row_offsets(t0, h, H, K, T, HEAD_FIRST)
    kstride = K if HEAD_FIRST else H * K
    G_row0 = G_ptr + (t0.to(tl.int64) * H + h) * K
    P = tl.zeros((C, C), tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < K
        if SCALAR:
            q = load_operand(q_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
            k = load_operand(k_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
            P += tl.dot(q, tl.trans(k), input_precision=PREC)
        else:
            q = load_tile(q_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
            k = load_tile(k_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
            G = load_gate(G_ptr, grows, i < C, h, H, K, kk, kmask)
            P = gram(P, q, k, G, k_row0, kstride, G_row0, H * K, kk, kmask, n, C, BC, PREC, DPREC)
    if SCALAR:
        P *= scalar_decays(G_ptr, grows, h, H, C)
    store_tile(P_ptr, P * scale, rows, rmask, h, H, C, i, i < C)


@triton.jit
def states_kernel(k_ptr, v_ptr, G_ptr, h0_ptr, ht_ptr, hs_ptr, cu_ptr, off_ptr, H, T, K, V, C: tl.constexpr,
                  KB: tl.constexpr, NKB: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                  STORE_FINAL: tl.constexpr, HEAD_FIRST: tl.constexpr, SCALAR: tl.constexpr, PREC: tl.constexpr,
                  BF16X2: tl.constexpr):
    """One value block, sequence, head and K-block ``kb0``: walk the chunks, the state's rows
    ``kb0 * KB ..`` in registers; ``hs[c] = S0`` (chunk c's entry state),
    ``S1 = Diag(e^{G_last}) S0 + (k e^{G_last - G})^T V`` (``BF16X2``: V as stored in bf16, the left
    operand in two bf16 parts, ``chunk.state.split_dot``)."""
    nh, h, bos, eos, c_first, vv, vmask = serial_program(cu_ptr, off_ptr, H, V, BV)
    kb0 = tl.program_id(2)
    S0, S1, S2, S3 = load_blocks(h0_ptr, nh, K, V, KB, NKB, BV, vv, vmask, HAS_H0, kb0)
    for it in range(tl.cdiv(eos - bos, C)):
        t0, rows, rmask, grows, last = serial_chunk(bos, eos, it, C)
        store_blocks(hs_ptr, S0, S1, S2, S3, (c_first + it) * H + h, K, V, KB, NKB, vv, vmask, kb0)
        v = load_operand(v_ptr, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST)
        if not BF16X2:
            v = v.to(tl.float32)
        S0, S1, S2, S3 = write_blocks(S0, S1, S2, S3, v, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, KB, NKB,
                                      PREC, T, HEAD_FIRST, SCALAR, kb0)
    if STORE_FINAL:
        store_blocks(ht_ptr, S0, S1, S2, S3, nh, K, V, KB, NKB, vv, vmask, kb0)


@triton.jit
def dstate_kernel(q_ptr, G_ptr, do_ptr, dht_ptr, dh_ptr, dh0_ptr, cu_ptr, off_ptr, scale, H, T, K, V,
                  C: tl.constexpr, KB: tl.constexpr, NKB: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr,
                  STORE_DH0: tl.constexpr, HEAD_FIRST: tl.constexpr, SCALAR: tl.constexpr, PREC: tl.constexpr,
                  BF16X2: tl.constexpr):
    """One value block, sequence, head and K-block ``kb0``: the state gradient's rows ``kb0 * KB ..``,
    last chunk first; ``dh[c]`` is the gradient of chunk c's exit state (``BF16X2``: dO as stored in
    bf16, see ``states_kernel``)."""
    nh, h, bos, eos, c_first, vv, vmask = serial_program(cu_ptr, off_ptr, H, V, BV)
    kb0 = tl.program_id(2)
    dS0, dS1, dS2, dS3 = load_blocks(dht_ptr, nh, K, V, KB, NKB, BV, vv, vmask, HAS_DHT, kb0)
    num = tl.cdiv(eos - bos, C)
    for back in range(num):
        it = num - 1 - back
        t0, rows, rmask, grows, last = serial_chunk(bos, eos, it, C)
        store_blocks(dh_ptr, dS0, dS1, dS2, dS3, (c_first + it) * H + h, K, V, KB, NKB, vv, vmask, kb0)
        do = load_operand(do_ptr, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST)
        if not BF16X2:
            do = do.to(tl.float32)
        dS0, dS1, dS2, dS3 = dwrite_blocks(dS0, dS1, dS2, dS3, do, q_ptr, G_ptr, rows, rmask, grows, last, h, H, K,
                                           scale, KB, NKB, PREC, T, HEAD_FIRST, SCALAR, kb0)
    if STORE_DH0:
        store_blocks(dh0_ptr, dS0, dS1, dS2, dS3, nh, K, V, KB, NKB, vv, vmask, kb0)


@triton.jit
def grads_qk_kernel(q_ptr, k_ptr, v_ptr, G_ptr, hs_ptr, dh_ptr, do_ptr, dq_ptr, dk_ptr, dG_ptr, cu_ptr, seq_ptr,
                    start_ptr, scale, H, T, K, V, TOTAL, C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, HEAD_FIRST: tl.constexpr, SCALAR: tl.constexpr, PREC: tl.constexpr,
                    DPREC: tl.constexpr):
    """One chunk, head and channel block: dq, dk and dG (fp32 ``[T, H, K]``; simple GLA: its sum over
    this block's channels, part kb of ``[NKB, T, H]``), see the module docstring. dG's pair terms are
    formed so that what cancels exactly in the math cancels in fp32 too (the diagonal pairs; for
    simple GLA ``sum_j MA_ij - sum_j MA_ji`` with ``MA = M * (q k^T)``), so that a decay that
    multiplies a zero state gets a zero gradient, not a rounding residue."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    kb = tl.program_id(2)
    t0, n, i, rows, rmask, grows = chunk_rows(c, cu_ptr, seq_ptr, start_ptr, C)
    kk = kb * BK + tl.arange(0, BK)
    kmask = kk < K
    q_in = load_operand(q_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
    k_in = load_operand(k_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
    q, k = q_in.to(tl.float32), k_in.to(tl.float32)
    G = load_gate(G_ptr, grows, i < C, h, H, K, kk, kmask, SCALAR)
    G_last = load_gate_row(G_ptr, t0 + n - 1, h, H, K, kk, kmask, SCALAR)
    cv = tl.arange(0, BV)
    dQs = tl.zeros((C, BK), tl.float32)
    dKs = tl.zeros((C, BK), tl.float32)
    dgamma = tl.zeros((BK,), tl.float32)
    dP = tl.zeros((C, C), tl.float32)
    state_base = (c.to(tl.int64) * H + h) * K * V
    for v0 in range(0, V, BV):
        vv = v0 + cv
        vmask = vv < V
        s_off = state_base + kk.to(tl.int64)[:, None] * V + vv[None, :]
        s_mask = kmask[:, None] & vmask[None, :]
        hs = tl.load(hs_ptr + s_off, mask=s_mask, other=0.0)
        dh = tl.load(dh_ptr + s_off, mask=s_mask, other=0.0)
        do = load_operand(do_ptr, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST)
        v = load_operand(v_ptr, rows, rmask, h, H, V, vv, vmask, T, HEAD_FIRST)
        dQs += tl.dot(do.to(hs.dtype), tl.trans(hs), input_precision=PREC)
        dKs += tl.dot(v.to(dh.dtype), tl.trans(dh), input_precision=PREC)
        dgamma += tl.sum(hs.to(tl.float32) * dh.to(tl.float32), axis=1)
        dP += tl.dot(do, tl.trans(v.to(do.dtype)), input_precision=PREC)
    dKd = decay(G_last[None, :] - G) * dKs
    dq_s = scale * decay(G) * dQs
    last = tl.where(i[:, None] == n - 1, (tl.sum(k * dKd, axis=0) + decay(G_last) * dgamma)[None, :], 0.0)
    if SCALAR:
        M = tl.where(i[:, None] >= i[None, :], dP, 0.0) * scalar_decays(G_ptr, grows, h, H, C)
        dq = dq_s + scale * tl.dot(M, k, input_precision=PREC)
        dk = dKd + scale * tl.dot(tl.trans(M), q, input_precision=PREC)
        # the pairs' share of dG_i summed over channels: sum_j MA_ij - sum_j MA_ji (0 on the diagonal, exactly)
        MA = M * tl.dot(q_in, tl.trans(k_in), input_precision=PREC)
        dG = tl.sum(q * dq_s - k * dKd + last, axis=1) + scale * (tl.sum(MA, axis=1) - tl.sum(MA, axis=0))
    else:
        # the diagonal pairs (j = i, decay 1) apart: their share of dG, q_i M_ii k_i - k_i M_ii q_i, is 0 exactly
        M = tl.where(i[:, None] > i[None, :], dP, 0.0)
        m_ii = tl.sum(tl.where(i[:, None] == i[None, :], dP, 0.0), axis=1)[:, None]
        row0 = row_offsets(t0, h, H, K, T, HEAD_FIRST)
        kstride = K if HEAD_FIRST else H * K
        G_row0 = G_ptr + (t0.to(tl.int64) * H + h) * K
        Rq = scale * rowform(M, k, G, k_ptr + row0, kstride, G_row0, H * K, kk, kmask, n, C, BC, PREC, DPREC)
        Rk = scale * colform(M, q, G, q_ptr + row0, kstride, G_row0, H * K, kk, kmask, n, C, BC, PREC, DPREC)
        dq = dq_s + Rq + scale * m_ii * k
        dk = dKd + Rk + scale * m_ii * q
        dG = q * (dq_s + Rq) - k * (dKd + Rk) + last
    store_tile(dq_ptr, dq, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
    store_tile(dk_ptr, dk, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
    if SCALAR:
        tl.store(dG_ptr + (kb.to(tl.int64) * TOTAL + rows) * H + h, dG, mask=rmask)
    else:
        store_tile(dG_ptr, dG, rows, rmask, h, H, K, kk, kmask)


# ------------------------------------------------------------------------------------ launchers
# Every launcher takes the token tensors in their layout (``head_first``, with T tokens per batch
# row) and the chunk table of the flattened tokens.


def dv_ladder(K: int, V: int, C: int) -> list[dict]:
    """Launch ladder of dv's ``chunk.output.output_kernel`` (``REVERSE``): at C = 64 ``state_term_ladder``'s
    blocks at 4 warps first, measured on an H200 (bf16, B=8, T=4096, H=16, K=V=128, with ``grads_qk_kernel``,
    ``benchmarks/results/gla_profile_h200.json``): GLA 4.11 -> 3.64 ms, simple GLA 1.70 -> 1.54."""
    ladder = state_term_ladder(K, V, C)
    return [ladder[0] | dict(num_warps=4), *ladder] if C == 64 else ladder


def chunk_cumsum(x: torch.Tensor, out: torch.Tensor, chunks: Chunks, H: int, T: int, D: int, *, parts: int,
                 x_head_first: bool, out_head_first: bool, reverse: bool) -> torch.Tensor:
    """``out = `` the chunk-local (reverse) cumulative sum of the sum of the ``parts`` parts of x."""
    if chunks.num_chunks and H:
        cumsum_kernel[(chunks.num_chunks, H)](
            x, out, chunks.cu, chunks.seq, chunks.start, H, T, D, parts, chunks.tokens,
            C=chunks.size, BD=min(padded(D), 32), X_HF=x_head_first, Y_HF=out_head_first, REVERSE=reverse)
    return out


def intra(q, k, G, chunks: Chunks, H: int, T: int, scale: float, head_first: bool, scalar: bool, precision: str,
          config: dict | None = None):
    """P of every chunk: fp32 ``[tokens, H, C]``, scale included; ``config`` replaces the launch settings
    (``benchmarks/gla.py --profile``)."""
    K = q.shape[-1]
    total = chunks.tokens
    P = torch.empty(total, H, chunks.size, device=q.device, dtype=torch.float32)
    if chunks.num_chunks and H:
        # C = 64, measured on an H200 (bf16, B=8, T=4096, H=16, K=128, benchmarks/results/gla_profile_h200.json):
        # GLA 0.649 ms at BK = 32, 4 warps, loads double-buffered (0.953 at BK = 16 and one stage, which
        # spills no register where 32 spills 120 B, Triton 3.6 sm_90), simple GLA 0.155 at BK = 64, 4 warps
        # and two stages (0.219 at 32 and one). C = 128 (P [128, 128] fp32) takes 8 warps (4: 1568 B of
        # stack) and so blocks of MIN_BLOCK (GLA at K = 128: 560 B of stack). The last step: the narrowest
        # blocks, where shared memory runs short.
        if chunks.size == 64:
            cfg = dict(BK=64 if scalar else MIN_BLOCK, num_warps=4, num_stages=2)
        else:
            cfg = dict(BK=MIN_BLOCK, num_warps=8, num_stages=1)
        ladder = [cfg, dict(BK=16, num_warps=cfg["num_warps"], num_stages=1)]
        launch(intra_kernel, (chunks.num_chunks, H), (q, k, G, P, chunks.cu, chunks.seq, chunks.start, scale, H, T, K),
               dict(C=chunks.size, BC=SUB, HEAD_FIRST=head_first, SCALAR=scalar, PREC=precision,
                    DPREC=diag_precision(precision)),
               [config] if config else ladder)
    return P


def update_in_bf16x2(bf16x2: bool | None, dtype: torch.dtype, precision: str, split: bool) -> bool:
    """Whether a state pass's update dot takes its values as stored in bf16 and its fp32 operand in two
    bf16 parts (``chunk.state.split_dot``): ``bf16x2`` where given (``benchmarks/gla.py --profile``), else
    for bf16 inputs under "tf32" in a pass not split by K-block. Measured on an H200 (bf16, H=16,
    K=V=128, ``gla_profile_h200.json``, ms): at B=8, T=4096 (unsplit) GLA's forward state pass with the
    output 0.917 -> 0.843 and its reverse pass 0.458 -> 0.378, simple GLA's 0.607 -> 0.579 and
    0.315 -> 0.267; at B=1, T=32768 (split, 8 warps) they lose, GLA 1.896 -> 1.995 and 1.175 -> 1.277.
    The fp32 operand keeps about 16 mantissa bits where "tf32" keeps 10 (the final state's error
    3.9e-4 -> 2.4e-6, interpreted, ``tests/test_optimized_gla.py``); "ieee" and "tf32x3" keep their
    fp32 dots."""
    if bf16x2 is None:
        bf16x2 = precision == "tf32" and not split
    return bf16x2 and dtype == torch.bfloat16


def launch_state_pass(kernel, args: tuple, constexprs: dict, chunks: Chunks, H: int, K: int, V: int,
                      split_k: bool | None, serial: dict | None, bf16x2: bool | None, dtype: torch.dtype,
                      reverse: bool = False):
    """``launch_serial`` of a GLA state pass, split by K-block as ``split_by_k_block`` says, state blocks
    at least ``MIN_BLOCK`` wide, a split pass at 8 warps, the unsplit ``reverse`` pass (``dstate``) with
    its loads double-buffered, the update's dot as ``update_in_bf16x2`` says for the values' ``dtype``;
    ``serial`` overrides the launch settings (and ``split_k``). Measured (bf16,
    H=16, K=V=128, ``gla_profile_h200.json`` on an H200): 8 warps at B=1, T=32768, GLA's forward state
    pass with the output 2.23 -> 1.90 ms, its reverse pass 1.39 -> 1.16, simple GLA's unchanged (1.29,
    0.91); two stages for the reverse pass at B=8, T=4096: GLA 0.513 -> 0.456, simple GLA 0.395 -> 0.316
    (for the forward pass they lose, 0.935 -> 1.020 with the output)."""
    cfg = dict(serial or {})
    split = split_by_k_block(cfg.pop("split_k", split_k), chunks, H, V)
    if not serial:
        cfg = dict(num_warps=8) if split else dict(num_stages=2) if reverse else {}
    constexprs = dict(constexprs, BF16X2=update_in_bf16x2(bf16x2, dtype, constexprs["PREC"], split))
    launch_serial(kernel, args, constexprs, chunks, H, K, V, cfg or None, split_k=split, min_block=MIN_BLOCK)


def forward(q, k, v, G, P, h0, chunks: Chunks, H: int, T: int, scale: float, head_first: bool, scalar: bool,
            precision: str, *, final: bool, split_k: bool | None = None, serial: dict | None = None,
            output: dict | None = None, hs_dtype: torch.dtype | None = None, bf16x2: bool | None = None):
    """``(o like v in q's dtype, final state [N, H, K, V] fp32 or None, entry states h [NC, H, K, V] in
    ``state_dtype``): the serial state pass, then the output of every chunk in parallel. ``serial`` and
    ``output`` replace the two launches' settings, ``hs_dtype`` the stored states' dtype, ``bf16x2`` (bf16
    inputs) the state update's dot (``states_kernel``) (``benchmarks/gla.py --profile``)."""
    K, V = q.shape[-1], v.shape[-1]
    f32 = torch.float32
    ht = torch.empty(chunks.num_seqs, H, K, V, device=q.device, dtype=f32) if final else None
    hs = torch.empty(chunks.num_chunks, H, K, V, device=q.device, dtype=hs_dtype or state_dtype(q.dtype))
    launch_state_pass(states_kernel,
                      (k, v, G, h0 if h0 is not None else hs, ht if final else hs, hs, chunks.cu, chunks.offsets, H,
                       T, K, V),
                      dict(HAS_H0=h0 is not None, STORE_FINAL=final, HEAD_FIRST=head_first, SCALAR=scalar,
                           PREC=precision), chunks, H, K, V, split_k, serial, bf16x2, v.dtype)
    o = chunk_output(q, v, G, P, hs, chunks, H, T, scale, head_first, scalar, precision, output)
    return o, ht, hs


def dstate(q, G, do, dht, chunks: Chunks, H: int, T: int, V: int, scale: float, head_first: bool, scalar: bool,
           precision: str, want_dh0: bool, split_k: bool | None = None, serial: dict | None = None,
           bf16x2: bool | None = None):
    """``(dh [NC, H, K, V] fp32, dh0 [N, H, K, V] fp32 or None)``; ``serial`` replaces the launch settings,
    ``bf16x2`` (bf16 inputs) the update's dot (``dstate_kernel``) (``benchmarks/gla.py --profile``)."""
    K = q.shape[-1]
    f32 = torch.float32
    dh = torch.empty(chunks.num_chunks, H, K, V, device=q.device, dtype=torch.float32)
    dh0 = torch.empty(chunks.num_seqs, H, K, V, device=q.device, dtype=f32) if want_dh0 else None
    launch_state_pass(dstate_kernel,
                      (q, G, do, dht if dht is not None else dh, dh, dh0 if want_dh0 else dh, chunks.cu,
                       chunks.offsets, scale, H, T, K, V),
                      dict(HAS_DHT=dht is not None, STORE_DH0=want_dh0, HEAD_FIRST=head_first, SCALAR=scalar,
                           PREC=precision), chunks, H, K, V, split_k, serial, bf16x2, do.dtype, reverse=True)
    return dh, dh0


def grads(q, k, v, G, P, hs, dh, do, chunks: Chunks, H: int, T: int, scale: float, head_first: bool, scalar: bool,
          precision: str, qk: dict | None = None, dv: dict | None = None):
    """``(dq, dk, dv, dG)``: dq, dk, dv like q, k, v; dG fp32 ``[1, tokens, H, K]`` (simple GLA:
    ``[NKB, tokens, H]``, partial sums over channel blocks) before the reverse cumulative sum; ``qk`` and
    ``dv`` replace the launch settings of ``grads_qk_kernel`` and of dv's ``chunk.output.output_kernel`` (``benchmarks/gla.py
    --profile``)."""
    K, V = q.shape[-1], v.shape[-1]
    total = chunks.tokens
    C = chunks.size
    # 4 warps, measured on an H200 (bf16, B=8, T=4096, H=16, K=V=128, with dv's kernel,
    # benchmarks/results/gla_profile_h200.json): GLA 4.08 ms with three load stages (4.27 with two) against
    # 6.23 at 8 warps and one stage, simple GLA 1.61 at BK = 64 and three stages (1.70 with two) against 2.61;
    # 8 warps and one stage where shared memory runs short. sm_90, C = 64 (Triton 3.6): BK = BV = 64 at 4 warps spills
    # 3016 B (gla)
    first = dict(BK=64 if scalar else MIN_BLOCK, BV=MIN_BLOCK, num_warps=4, num_stages=3)
    ladder = [qk] if qk else [first, dict(BK=MIN_BLOCK, BV=MIN_BLOCK, num_warps=8, num_stages=1)]
    dq, dk, dv_out = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    # simple GLA: a part of dG per channel block of the step that runs (those of the narrowest step allocated); the
    # grid by that step's blocks too: sized by the first step's, a fallback to narrower blocks left channels unwritten
    # (an H200 law run: dq, dk wrong at C = 128, K = 53, where the first step needs more shared memory than it has)
    parts = max(triton.cdiv(K, step["BK"]) for step in ladder)
    dG = torch.empty(*((parts, total, H) if scalar else (1, total, H, K)), device=q.device, dtype=torch.float32)
    if chunks.num_chunks and H:
        table = (chunks.cu, chunks.seq, chunks.start)
        flags = dict(C=C, HEAD_FIRST=head_first, SCALAR=scalar, PREC=precision)
        step = launch(grads_qk_kernel, lambda meta: (chunks.num_chunks, H, triton.cdiv(K, meta["BK"])),
                      (q, k, v, G, hs, dh, do, dq, dk, dG, *table, scale, H, T, K, V, total),
                      flags | dict(BC=SUB, DPREC=diag_precision(precision)), ladder)
        dG = dG[:triton.cdiv(K, step["BK"])] if scalar else dG
    chunk_products(k, do, G, P, dh, dv_out, chunks, H, T, 1.0, head_first, scalar, precision,
                   [dv] if dv else dv_ladder(K, V, C), reverse=True)
    return dq, dk, dv_out, dG
