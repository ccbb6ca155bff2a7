"""K-blocks of the recurrent state for the sequential (chunk-by-chunk) kernels of KDA and GLA.

The serial kernels hold a state ``S [K, BV]`` (or its gradient) in registers for a whole sequence.
Per chunk they need the K-side tiles ``k e^G``, ``q e^G``, ``k e^{G_last - G}`` ``[C, K]``: formed
for all of K at once they would not fit in registers. So the state lives in up to four blocks
``S_b [KB, BV]`` (``state_blocks``: ``KB = min(K, 64)`` padded, or up to 128 where a pass asks for it, as KDA's
recomputation does, ``NKB = KP / KB``), named variables in the kernels, and every helper here reads the K-side tiles
of one block only, right before its dot. The blocks a program holds are ``kb0 .. kb0 + NKB - 1``: all of them
(``kb0 = 0``), or, where the state's rows are independent (GLA), one K-block per program
(``launch_serial(split_k=True)``).

The ops differ in what a chunk writes (KDA: the delta rule's ``U``, GLA: ``V``) and in where their
K-side tiles come from. GLA's helpers (``write_blocks``, ``dwrite_blocks``) form them from k or q and G
right before each dot, chosen by constexpr options: ``SCALAR`` (simple GLA's ``[T, H]`` gate, one decay
per token) and the token layout of q and k (``T``, ``HEAD_FIRST``, see ``tiles``). KDA's read them
prepared in parallel before the pass (``prepared``: ``read_blocks``, ``update_blocks``), so that its serial
steps only load and multiply; it loads them, v, T and P through TMA descriptors where the tensors allow
(``common.tma_operands``, ``tiles.load_rows``), without the address and mask arithmetic of pointer loads (Triton 3.6,
sm_90: the forward step 1826 -> 1624 SASS instructions, 1479 with its state stores through TMA, at c31a24a).
GLA forms its output from the stored states in a parallel kernel (``chunk.output``), KDA's forward pass where it forms
U (``kda.chunk_fwd.recurrence``).

Conventions: ``rows`` are the chunk's token rows (masked past its end by ``rmask``), ``grows`` the
same rows clamped to the last valid one (for G, so that padded rows decay nothing), ``last`` the
chunk's last valid token.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import Chunks, Selection, launch, padded
from .scaled import pow2_at_or_above, pow2_reciprocal, scale_rows, store_scaled
from .tiles import decay, load_gate, load_gate_row, load_rows, load_rows_stored, load_tile, row_offsets, selected


@triton.jit
def block_cols(kb, KB: tl.constexpr, K):
    kk = kb * KB + tl.arange(0, KB)
    return kk, kk < K


@triton.jit
def state_ptrs(ptr, idx, K, V, kb, KB: tl.constexpr, vv, vmask):
    """Pointers and mask of block kb of state ``idx`` in a ``[*, K, V]`` array."""
    kk, kmask = block_cols(kb, KB, K)
    return ptr + (idx.to(tl.int64) * K + kk[:, None]) * V + vv[None, :], kmask[:, None] & vmask[None, :]


@triton.jit
def load_state(ptr, idx, K, V, kb, KB: tl.constexpr, BV: tl.constexpr, vv, vmask,
               PRESENT: tl.constexpr, TMA: tl.constexpr = False, v0=0):
    """Block kb of state ``idx`` (zeros when not ``PRESENT``); with ``TMA`` ptr is a descriptor of the ``[*, K, V]``
    array by ``[1, KB, BV]`` blocks (``common.tma_operands``), the columns ``vv`` from ``v0`` on."""
    if not PRESENT:
        out = tl.zeros((KB, BV), tl.float32)
    elif TMA:
        out = ptr.load([idx, kb * KB, v0]).reshape(KB, BV).to(tl.float32)
    else:
        p, m = state_ptrs(ptr, idx, K, V, kb, KB, vv, vmask)
        out = tl.load(p, mask=m, other=0.0).to(tl.float32)
    return out


@triton.jit
def store_state(ptr, S, idx, K, V, kb, KB: tl.constexpr, vv, vmask, s_ptr=0, SCALED: tl.constexpr = False,
                TMA: tl.constexpr = False):
    """Block kb of state ``idx``, rounded to the array's dtype (GLA stores its per-chunk states in bf16
    for bf16 inputs, ``chunk.output.state_dtype``); with ``SCALED`` row-scaled (``scaled``: the scales
    ``[*, K, NSB]`` at s_ptr, one per row and value block, the program's axis 0). With ``TMA`` ptr is a
    descriptor of the ``[*, K, V]`` array by ``[1, KB, BV]`` blocks (``common.tma_operands``), which stores nothing
    past K or V."""
    kk, kmask = block_cols(kb, KB, K)
    s_p = s_ptr + (idx.to(tl.int64) * K + kk) * tl.num_programs(0) + tl.program_id(0)
    if TMA:
        X = S
        if SCALED:
            X, s = scale_rows(S)
            tl.store(s_p, s, mask=kmask)
        ptr.store([idx, kb * KB, tl.program_id(0) * S.shape[1]], X.to(ptr.dtype).reshape(1, KB, S.shape[1]))
    else:
        p, m = state_ptrs(ptr, idx, K, V, kb, KB, vv, vmask)
        store_scaled(p, m, s_p, kmask, S, SCALED)


@triton.jit
def decays(G_ptr, grows, last, h, H, K, kk, kmask, SCALAR: tl.constexpr = False):
    """``(e^G [C, KB], e^{G_last - G} [C, KB], e^{G_last} [KB])`` of one K-block (``SCALAR``: the gate
    is ``[T, H]``, one decay per token broadcast over the channels; see ``tiles.load_gate``)."""
    G = load_gate(G_ptr, grows, grows >= 0, h, H, K, kk, kmask, SCALAR)
    G_last = load_gate_row(G_ptr, last, h, H, K, kk, kmask, SCALAR)
    return decay(G), decay(G_last[None, :] - G), decay(G_last)


@triton.jit
def split_dot(x, y, PREC: tl.constexpr):
    """``x @ y`` for an fp32 ``x``: one dot at ``PREC`` for an fp32 y; for a 16-bit y (values stored in
    bf16, taken as they are) x split into two parts of y's dtype, ``hi = round(x)`` and ``lo = round(x - hi)``,
    and two 16-bit dots: x kept to about 16 mantissa bits where "tf32" keeps 10, and the 16-bit dots
    read transposed operands from shared memory as Hopper's tf32 dots do not."""
    if y.dtype == tl.float32:
        out = tl.dot(x, y, input_precision=PREC)
    else:
        hi = x.to(y.dtype)
        out = tl.dot((x - hi.to(tl.float32)).to(y.dtype), y, tl.dot(hi, y))
    return out


@triton.jit
def write_block(S, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, kb, KB: tl.constexpr,
                PREC: tl.constexpr, T=1, HEAD_FIRST: tl.constexpr = False, SCALAR: tl.constexpr = False):
    """Forward, block kb: ``S_b <- e^{G_last} S_b + (k e^{G_last - G})^T U`` (``split_dot``)."""
    kk, kmask = block_cols(kb, KB, K)
    _, e_d, gamma = decays(G_ptr, grows, last, h, H, K, kk, kmask, SCALAR)
    k = load_tile(k_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
    return gamma[:, None] * S + split_dot(tl.trans(k * e_d), U, PREC)


@triton.jit
def dwrite_block(dS, do, q_ptr, G_ptr, rows, rmask, grows, last, h, H, K, scale, kb, KB: tl.constexpr,
                 PREC: tl.constexpr, T=1, HEAD_FIRST: tl.constexpr = False, SCALAR: tl.constexpr = False):
    """Backward (GLA), block kb: ``dS_b <- e^{G_last} dS_b + scale (q e^G)^T dO`` (``split_dot``)."""
    kk, kmask = block_cols(kb, KB, K)
    eG, _, gamma = decays(G_ptr, grows, last, h, H, K, kk, kmask, SCALAR)
    q = load_tile(q_ptr, rows, rmask, h, H, K, kk, kmask, T, HEAD_FIRST)
    return gamma[:, None] * dS + split_dot(tl.trans(q * (eG * scale)), do, PREC)


# ------------------------------------------------------------------------- prepared operands (KDA)
# KDA's passes read their K-side operands ``x = Diag(s) X`` prepared in parallel (``prepared``), the row
# scales s powers of two, so that ``s X`` is exact and may be either dot's first operand (``FIRST``: the blocks'
# dots then share their second operand and accumulate into one tile) or stay outside the dots. Measured on an
# H200 (bf16, H=16, K=V=128, at b124c6f), scales first against outside: the
# forward pass at B=8 0.822 -> 0.785 ms, at B=1 over segments 1.860 -> 1.863; the reverse pass 1.160 -> 1.294 and
# 3.225 -> 3.369. So the forward pass takes them first, the reverse pass outside.
#
# A step loads its small vectors (row scales, beta, ``e^{G_last}``) first, before its first dot
# (``block_scales``, ``block_gammas``): loaded where they are used, each load sat behind the barrier of the dot
# before it, and its latency added to the step's. Measured on an H200 (at e10d98b):
# B=1, T=32768 forward pass 2.45 -> 2.21 ms in one pass, 1.91 -> 1.88 over segments; reverse pass over segments
# 3.39 -> 3.25; B=8 forward 0.83 (unchanged), reverse 1.25 -> 1.17.


@triton.jit
def row_scales(s_ptr, rows, rmask, h, H, NSB, sb):
    """The row scales ``s[rows, h, sb]`` of a prepared operand (``[T, H, NSB]``, scale block sb), ``[C]``."""
    return tl.load(s_ptr + row_offsets(rows, h, H, NSB) + sb, mask=rmask, other=0.0)


@triton.jit
def block_scales(s_ptr, rows, rmask, h, H, NSB, KB: tl.constexpr, SB: tl.constexpr, NKB: tl.constexpr):
    """The row scales of state blocks 0..3 (``KB`` rows each, block 0's again past ``NKB``) of a prepared operand
    scaled by column blocks of ``SB >= KB`` (``NSB`` of them): state block b lies in scale block ``b KB / SB``."""
    tl.static_assert(SB % KB == 0, "a state block lies in one scale block")
    s0 = row_scales(s_ptr, rows, rmask, h, H, NSB, 0)
    s1 = s0
    s2 = s0
    s3 = s0
    if NKB > 1:
        s1 = row_scales(s_ptr, rows, rmask, h, H, NSB, KB // SB)
    if NKB > 2:
        s2 = row_scales(s_ptr, rows, rmask, h, H, NSB, 2 * KB // SB)
    if NKB > 3:
        s3 = row_scales(s_ptr, rows, rmask, h, H, NSB, 3 * KB // SB)
    return s0, s1, s2, s3


@triton.jit
def block_gamma(G_ptr, last, h, H, K, kb, KB: tl.constexpr, SCALAR: tl.constexpr = False):
    """``e^{G_last}`` of block kb, ``[KB]`` (``SCALAR``: of a ``[T, H]`` gate, broadcast)."""
    kk, kmask = block_cols(kb, KB, K)
    return decay(load_gate_row(G_ptr, last, h, H, K, kk, kmask, SCALAR))


@triton.jit
def block_gammas(G_ptr, last, h, H, K, KB: tl.constexpr, NKB: tl.constexpr, SCALAR: tl.constexpr = False):
    """``e^{G_last}`` of blocks 0..3 (block 0's again past ``NKB``; ``SCALAR``: ``block_gamma``)."""
    g0 = block_gamma(G_ptr, last, h, H, K, 0, KB, SCALAR)
    g1 = g0
    g2 = g0
    g3 = g0
    if NKB > 1:
        g1 = block_gamma(G_ptr, last, h, H, K, 1, KB, SCALAR)
    if NKB > 2:
        g2 = block_gamma(G_ptr, last, h, H, K, 2, KB, SCALAR)
    if NKB > 3:
        g3 = block_gamma(G_ptr, last, h, H, K, 3, KB, SCALAR)
    return g0, g1, g2, g3


@triton.jit
def rows_dot(Z, S, x, s, t0, rows, rmask, h, H, K, kb, KB: tl.constexpr, FIRST: tl.constexpr, PREC: tl.constexpr,
             TMA: tl.constexpr):
    """``Z + x_b S_b``, ``[C, BV]``: block kb of a prepared operand ``x_b = Diag(s) X_b`` (pointer, or with ``TMA``
    descriptor: ``tiles.load_rows``) times block kb of a state; with ``FIRST`` the dot takes ``s X_b`` (exact: s is a
    power of two) and accumulates into Z, else ``Z + Diag(s) (X_b S_b)``."""
    X = load_rows(x, t0, rows, rmask, h, H, K, kb * KB, KB, TMA)
    if FIRST:
        out = tl.dot(s[:, None] * X, S, Z, input_precision=PREC)
    else:
        out = Z + s[:, None] * tl.dot(X, S, input_precision=PREC)
    return out


@triton.jit
def update_block(dS, Y, x, s, gamma, t0, rows, rmask, h, H, K, kb, KB: tl.constexpr, DECAY: tl.constexpr,
                 FIRST: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr):
    """Block kb: ``dS_b + x_b^T Y`` for a prepared operand ``x_b = Diag(s) X_b`` (as in ``rows_dot``), after
    ``dS_b <- Diag(gamma) dS_b`` with ``DECAY`` (KDA's forward update: ``S_b <- Diag(gamma) S_b + Kd_b^T U``);
    with ``FIRST`` the dot takes ``(s X_b)^T`` and accumulates into dS_b (every block's dot then has the same
    second operand Y), else ``dS_b + X_b^T (Diag(s) Y)``."""
    X = load_rows(x, t0, rows, rmask, h, H, K, kb * KB, KB, TMA)
    if DECAY:
        dS = gamma[:, None] * dS
    if FIRST:
        out = tl.dot(tl.trans(s[:, None] * X), Y, dS, input_precision=PREC)
    else:
        out = dS + tl.dot(tl.trans(X), s[:, None] * Y, input_precision=PREC)
    return out


# --------------------------------------------------------------------------------- all the blocks
# The serial kernels hold the state as four named blocks S0..S3; blocks kb >= NKB are zero tiles that
# no helper touches (the compiler drops them), so that every kernel is written once for any NKB.


@triton.jit
def load_blocks(ptr, idx, K, V, KB: tl.constexpr, NKB: tl.constexpr, BV: tl.constexpr, vv, vmask,
                PRESENT: tl.constexpr, kb0=0):
    """Blocks 0..3 of state ``idx`` (zeros when not ``PRESENT``, and past ``NKB``)."""
    S0 = load_state(ptr, idx, K, V, kb0 + 0, KB, BV, vv, vmask, PRESENT)
    S1 = tl.zeros((KB, BV), tl.float32)
    S2 = tl.zeros((KB, BV), tl.float32)
    S3 = tl.zeros((KB, BV), tl.float32)
    if NKB > 1:
        S1 = load_state(ptr, idx, K, V, kb0 + 1, KB, BV, vv, vmask, PRESENT)
    if NKB > 2:
        S2 = load_state(ptr, idx, K, V, kb0 + 2, KB, BV, vv, vmask, PRESENT)
    if NKB > 3:
        S3 = load_state(ptr, idx, K, V, kb0 + 3, KB, BV, vv, vmask, PRESENT)
    return S0, S1, S2, S3


@triton.jit
def store_blocks(ptr, S0, S1, S2, S3, idx, K, V, KB: tl.constexpr, NKB: tl.constexpr, vv, vmask, kb0=0, s_ptr=0,
                 SCALED: tl.constexpr = False, TMA: tl.constexpr = False):
    """``store_state`` of every block."""
    store_state(ptr, S0, idx, K, V, kb0 + 0, KB, vv, vmask, s_ptr, SCALED, TMA)
    if NKB > 1:
        store_state(ptr, S1, idx, K, V, kb0 + 1, KB, vv, vmask, s_ptr, SCALED, TMA)
    if NKB > 2:
        store_state(ptr, S2, idx, K, V, kb0 + 2, KB, vv, vmask, s_ptr, SCALED, TMA)
    if NKB > 3:
        store_state(ptr, S3, idx, K, V, kb0 + 3, KB, vv, vmask, s_ptr, SCALED, TMA)


@triton.jit
def read_blocks(S0, S1, S2, S3, Z, x, s0, s1, s2, s3, t0, rows, rmask, h, H, K, KB: tl.constexpr,
                NKB: tl.constexpr, FIRST: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr):
    """``Z + x S`` for a prepared operand x, row scales s0..s3 (``rows_dot`` of every block): the forward's
    ``V - Kg S`` (Z = V, the scales negated), the backward's ``P^T dO + Kd dS``."""
    Z = rows_dot(Z, S0, x, s0, t0, rows, rmask, h, H, K, 0, KB, FIRST, PREC, TMA)
    if NKB > 1:
        Z = rows_dot(Z, S1, x, s1, t0, rows, rmask, h, H, K, 1, KB, FIRST, PREC, TMA)
    if NKB > 2:
        Z = rows_dot(Z, S2, x, s2, t0, rows, rmask, h, H, K, 2, KB, FIRST, PREC, TMA)
    if NKB > 3:
        Z = rows_dot(Z, S3, x, s3, t0, rows, rmask, h, H, K, 3, KB, FIRST, PREC, TMA)
    return Z


@triton.jit
def half_state(S0, S1, S2, S3, NKB: tl.constexpr):
    """``(Sh0, Sh1, Sh2, Sh3, p)``: the state's blocks over the power of two p at or above its largest magnitude, in
    fp16 (blocks past ``NKB``: block 0's), for ``read_half_state``: every entry to a relative error of 2^-11 down to
    2^-14 p, below it to an absolute error of at most 2^-25 p. A "tf32" dot keeps the same 11 significant bits of the
    fp32 state, truncated, at half an fp16 dot's rate."""
    m = tl.abs(S0)
    if NKB > 1:
        m = tl.maximum(m, tl.abs(S1))
    if NKB > 2:
        m = tl.maximum(m, tl.abs(S2))
    if NKB > 3:
        m = tl.maximum(m, tl.abs(S3))
    p = pow2_at_or_above(tl.max(m))
    r = pow2_reciprocal(p)
    Sh0 = (S0 * r).to(tl.float16)
    Sh1, Sh2, Sh3 = Sh0, Sh0, Sh0
    if NKB > 1:
        Sh1 = (S1 * r).to(tl.float16)
    if NKB > 2:
        Sh2 = (S2 * r).to(tl.float16)
    if NKB > 3:
        Sh3 = (S3 * r).to(tl.float16)
    return Sh0, Sh1, Sh2, Sh3, p


@triton.jit
def half_product(x, Sh, acc, t0, rows, rmask, h, H, K, kb, KB: tl.constexpr, TMA: tl.constexpr):
    """``acc + X_b Sh_b``: block kb of an fp16 prepared operand as stored (its row scales left out) times block kb of
    the state as ``half_state`` gives it, an fp16 dot."""
    return tl.dot(load_rows_stored(x, t0, rows, rmask, h, H, K, kb * KB, KB, TMA), Sh, acc)


@triton.jit
def read_half_state(Z, Sh0, Sh1, Sh2, Sh3, p, x, s0, s1, s2, s3, t0, rows, rmask, h, H, K, KB: tl.constexpr,
                    NKB: tl.constexpr, SB: tl.constexpr, TMA: tl.constexpr):
    """``Z + x S`` (``read_blocks``) for an fp16 prepared operand ``x = Diag(s) X`` and the state as ``half_state``
    gives it, ``S = p Sh``: the blocks' products accumulated in their dots within each scale block of ``SB`` columns
    (whose blocks share their row scales), then ``Z + Diag(p s) (X Sh)`` once a scale block."""
    acc = half_product(x, Sh0, tl.zeros(Z.shape, tl.float32), t0, rows, rmask, h, H, K, 0, KB, TMA)
    s = s0
    if NKB > 1:
        if KB % SB == 0:
            Z = Z + (p * s)[:, None] * acc
            acc = tl.zeros(Z.shape, tl.float32)
        acc = half_product(x, Sh1, acc, t0, rows, rmask, h, H, K, 1, KB, TMA)
        s = s1
    if NKB > 2:
        if (2 * KB) % SB == 0:
            Z = Z + (p * s)[:, None] * acc
            acc = tl.zeros(Z.shape, tl.float32)
        acc = half_product(x, Sh2, acc, t0, rows, rmask, h, H, K, 2, KB, TMA)
        s = s2
    if NKB > 3:
        if (3 * KB) % SB == 0:
            Z = Z + (p * s)[:, None] * acc
            acc = tl.zeros(Z.shape, tl.float32)
        acc = half_product(x, Sh3, acc, t0, rows, rmask, h, H, K, 3, KB, TMA)
        s = s3
    return Z + (p * s)[:, None] * acc


@triton.jit
def write_blocks(S0, S1, S2, S3, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, KB: tl.constexpr,
                 NKB: tl.constexpr, PREC: tl.constexpr, T=1, HEAD_FIRST: tl.constexpr = False,
                 SCALAR: tl.constexpr = False, kb0=0):
    """``write_block`` of every block: ``S <- Diag(gamma) S + Kd^T U``."""
    S0 = write_block(S0, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, kb0 + 0, KB, PREC, T, HEAD_FIRST,
                     SCALAR)
    if NKB > 1:
        S1 = write_block(S1, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, kb0 + 1, KB, PREC, T, HEAD_FIRST,
                         SCALAR)
    if NKB > 2:
        S2 = write_block(S2, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, kb0 + 2, KB, PREC, T, HEAD_FIRST,
                         SCALAR)
    if NKB > 3:
        S3 = write_block(S3, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, kb0 + 3, KB, PREC, T, HEAD_FIRST,
                         SCALAR)
    return S0, S1, S2, S3


@triton.jit
def update_blocks(dS0, dS1, dS2, dS3, Y, x, s0, s1, s2, s3, g0, g1, g2, g3, t0, rows, rmask, h, H, K,
                  KB: tl.constexpr, NKB: tl.constexpr, DECAY: tl.constexpr, FIRST: tl.constexpr, PREC: tl.constexpr,
                  TMA: tl.constexpr):
    """``dS <- Diag(gamma) dS + x^T Y`` (``DECAY``; else ``dS + x^T Y``) for a prepared operand x, row scales
    s0..s3 and decays g0..g3 (``update_block`` of every block): the forward's ``S <- Diag(gamma) S + Kd^T U``,
    the backward's terms of ``dS <- Diag(gamma) dS + scale Qg^T dO - Kg^T Diag(beta) dY``."""
    dS0 = update_block(dS0, Y, x, s0, g0, t0, rows, rmask, h, H, K, 0, KB, DECAY, FIRST, PREC, TMA)
    if NKB > 1:
        dS1 = update_block(dS1, Y, x, s1, g1, t0, rows, rmask, h, H, K, 1, KB, DECAY, FIRST, PREC, TMA)
    if NKB > 2:
        dS2 = update_block(dS2, Y, x, s2, g2, t0, rows, rmask, h, H, K, 2, KB, DECAY, FIRST, PREC, TMA)
    if NKB > 3:
        dS3 = update_block(dS3, Y, x, s3, g3, t0, rows, rmask, h, H, K, 3, KB, DECAY, FIRST, PREC, TMA)
    return dS0, dS1, dS2, dS3


@triton.jit
def dwrite_blocks(dS0, dS1, dS2, dS3, do, q_ptr, G_ptr, rows, rmask, grows, last, h, H, K, scale, KB: tl.constexpr,
                  NKB: tl.constexpr, PREC: tl.constexpr, T=1, HEAD_FIRST: tl.constexpr = False,
                  SCALAR: tl.constexpr = False, kb0=0):
    """Backward (GLA): ``dS <- Diag(gamma) dS + scale Qg^T dO`` (``dwrite_block`` of every block)."""
    dS0 = dwrite_block(dS0, do, q_ptr, G_ptr, rows, rmask, grows, last, h, H, K, scale, kb0 + 0, KB, PREC, T,
                       HEAD_FIRST, SCALAR)
    if NKB > 1:
        dS1 = dwrite_block(dS1, do, q_ptr, G_ptr, rows, rmask, grows, last, h, H, K, scale, kb0 + 1, KB, PREC, T,
                           HEAD_FIRST, SCALAR)
    if NKB > 2:
        dS2 = dwrite_block(dS2, do, q_ptr, G_ptr, rows, rmask, grows, last, h, H, K, scale, kb0 + 2, KB, PREC, T,
                           HEAD_FIRST, SCALAR)
    if NKB > 3:
        dS3 = dwrite_block(dS3, do, q_ptr, G_ptr, rows, rmask, grows, last, h, H, K, scale, kb0 + 3, KB, PREC, T,
                           HEAD_FIRST, SCALAR)
    return dS0, dS1, dS2, dS3


@triton.jit
def serial_program(cu_ptr, off_ptr, H, V, BV: tl.constexpr, sel_ptr=0, SELECT: tl.constexpr = False):
    """A serial kernel's program (value block, sequence * H + head):
    ``(nh, h, bos, eos, c_first, vv, vmask)``: its sequence's token span and first chunk, its values. With
    ``SELECT`` the programs run the sequences listed at sel_ptr (``common.Selection``): n = ``sel[program's]``."""
    nh = tl.program_id(1)
    n = selected(nh // H, sel_ptr, SELECT)
    if SELECT:
        nh = n * H + nh % H
    bos = tl.load(cu_ptr + n)
    eos = tl.load(cu_ptr + n + 1)
    vv = tl.program_id(0) * BV + tl.arange(0, BV)
    return nh, nh % H, bos, eos, tl.load(off_ptr + n), vv, vv < V


@triton.jit
def serial_chunk(bos, eos, it, C: tl.constexpr):
    """Chunk ``it`` of a sequence: ``(t0, rows, rmask, grows, last)`` (see the module docstring)."""
    i = tl.arange(0, C)
    t0 = bos + it * C
    n = tl.minimum(eos - t0, C)
    return t0, t0 + i, i < n, t0 + tl.minimum(i, n - 1), t0 + n - 1


# ------------------------------------------------------------------------------------- launching


SMS = 132
"""Streaming multiprocessors of an H100 or H200 (SXM): a launch of fewer programs leaves some idle."""


def fills_gpu(V: int, programs: int) -> bool:
    """Whether ``programs`` (sequence, head) pairs, each split into value blocks of 64, give every SM
    of an H100/H200 a program."""
    return programs * triton.cdiv(V, 64) >= SMS


def serial_launch(V: int, programs: int, min_block: int = 16) -> dict:
    """Launch of a serial (chunk-by-chunk) kernel for ``programs`` (sequence, head) pairs: value blocks
    of 64 when that gives every SM of an H100/H200 a program (``fills_gpu``); else 32 with loads
    double-buffered, or 16 (where ``min_block`` allows) when even blocks of 32 leave SMs without a
    program. Measured on an H200 (B=8/T=4096/H=16 and B=1/T=32768/H=16, K=V=128, KDA's forward
    recurrence, ``benchmarks/kda.py --profile``): 64 against 32 at B=8, 1.23 vs 1.95 ms; at B=1 (64
    programs of 32 values, 128 of 16) 16 against 32, 4.11 vs 4.57 ms, and KDA's reverse pass 6.00 vs 6.47."""
    if padded(V) >= 64 and fills_gpu(V, programs):
        return dict(BV=64, num_warps=4, num_stages=1)
    if min_block <= 16 and padded(V) > 16 and programs * triton.cdiv(V, 32) < SMS:
        return dict(BV=16, num_warps=4, num_stages=2)
    return dict(BV=min(padded(V), 32), num_warps=4, num_stages=2)


GROUPS_KEPT = 8
"""How many sequence groupings ``sequence_groups`` keeps (by chunk table)."""
_groups: list[tuple] = []
LONG = 0.5
"""``sequence_groups``' long sequences: more than this fraction of the longest's chunks. Measured on an H100 (KDA's
forward as it was then, its output in a kernel of its own; bf16, H=16, K=V=128, the benchmark's 8 packed sequences of
512-8192 tokens, the first form of ``benchmarks/kda_groups.py``, at 0a0a52c): 2.321 ms without groups,
2.237 at 1/2, 2.231 at 5/8, 2.230 at 3/4, 2.274 at 7/8 (safe_gate 2.310, 2.225, 2.215, 2.214, 2.261): a half, the
simplest of the three within 0.01 ms. The backward keeps it (not measured apart)."""


def sequence_groups(chunks: Chunks) -> tuple[Selection, Selection] | None:
    """``(long, short)``: the sequences of more than ``LONG`` of the longest's chunks and the others (with their
    chunks), or None where every sequence is long. A serial pass lasts as long as its longest sequence, and where the
    lengths differ most SMs idle through its last steps: the pass over each group in a launch of its own, on streams of
    their own, lets the work that follows the short sequences' pass run in that time (KDA's gradients, ``kda.api``).
    Built on the device from lengths known on the host (no copy, no wait), the latest ``GROUPS_KEPT`` kept."""
    longest = max(chunks.counts, default=0)
    long = [n > LONG * longest for n in chunks.counts]
    if all(long):
        return None
    for cached, fraction, groups in _groups:
        if cached is chunks and fraction == LONG:
            return groups
    is_long = (chunks.offsets[1:] - chunks.offsets[:-1]) > LONG * longest
    seqs = torch.argsort((~is_long).to(torch.int8), stable=True).to(torch.int32)  # the long ones first, in order
    ids = torch.argsort((~is_long[chunks.seq.long()]).to(torch.int8), stable=True).to(torch.int32)
    n, m = sum(long), sum(c for c, is_ in zip(chunks.counts, long) if is_)
    groups = Selection(seqs[:n], ids[:m]), Selection(seqs[n:], ids[m:])
    _groups.append((chunks, LONG, groups))
    del _groups[:-GROUPS_KEPT]
    return groups


def single_stage(cfg: dict) -> list[dict]:
    """``[cfg, cfg without load pipelining]``: the fallback when the buffers exceed shared memory."""
    return [cfg, cfg | dict(num_stages=1)]


def state_blocks(K: int, minimum: int = 16, maximum: int = 64) -> tuple[int, int]:
    """``(KB, NKB)``: the state's K-blocks (at most ``maximum`` rows each, at least ``minimum``, at most four)."""
    kb = min(padded(K, minimum), maximum)
    return kb, padded(K, minimum) // kb


def serial_config(chunks: Chunks, H: int, K: int, V: int, config: dict | None, split_k: bool = False,
                  min_block: int = 16) -> dict:
    """The launch settings of ``launch_serial`` (its value block ``BV`` among them)."""
    splits = state_blocks(K, min_block)[1] if split_k else 1
    return serial_launch(V, chunks.num_seqs * H * splits, min_block) | (config or {})


def launch_serial(kernel, args: tuple, constexprs: dict, chunks: Chunks, H: int, K: int, V: int,
                  config: dict | None, split_k: bool = False, min_block: int = 16, max_block: int = 64,
                  select: Selection | None = None):
    """Launch a serial kernel: one program per (value block, sequence * H + head), the state in
    ``state_blocks(K, min_block, max_block)``, launch settings from ``serial_launch`` overridden by ``config``
    (``serial_config``). ``split_k``: one program per K-block too (``program_id(2)``, the kernel's ``kb0``;
    NKB = 1), for a recurrence whose state rows are independent (GLA's diagonal decay, not the delta rule).
    ``select``: the programs of its sequences only (``serial_program``'s ``SELECT``), at the launch settings of all."""
    N = chunks.num_seqs if select is None else select.num_seqs
    if not (N and H):
        return
    kb, nkb = state_blocks(K, min_block, max_block)
    splits = nkb if split_k else 1
    cfg = serial_config(chunks, H, K, V, config, split_k, min_block)
    launch(kernel, (triton.cdiv(V, cfg["BV"]), N * H, splits), args,
           dict(C=chunks.size, KB=kb, NKB=nkb // splits) | constexprs, single_stage(cfg))
