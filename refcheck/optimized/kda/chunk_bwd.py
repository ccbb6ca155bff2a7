"""Chunked KDA backward: the reverse state recurrence, then every input gradient per chunk in parallel.

Forward per chunk (see ``chunk_fwd``): ``Z = V - Kg S0``, ``U = T Diag(beta) Z``, ``O = Qg S0 + P U``,
``S1 = Diag(gamma) S0 + Kd^T U``, with ``T = (I + Diag(beta) A)^{-1}``. Given ``dO`` and ``dS1``:

    dU  = P^T dO + Kd dS1                 dY = T^T dU   (gradient of Y = Diag(beta) Z)
    dS0 = Diag(gamma) dS1 + Qg^T dO - Kg^T Diag(beta) dY

``dstate`` runs this backwards over the chunks of each sequence (one program per value block,
sequence and head), storing ``dS1`` of every chunk (``dh [NC, H, K, V]``) and ``dY`` (``[T, H, V]``); under
"tf32" these, and the recomputed forward pass's h and U, are stored row-scaled in fp16 (``chunk.scaled``: half
the memory, and the "tf32" dots that read them see them rounded to nearest).
``grads`` then works on each chunk independently, with ``h = S0``, ``dh = dS1``: first the value
side (``grads_v``: dv, and dL, dP stored for the key side), then the key side, one program per
channel block, in two kernels that pass fp32 partials of dq, dk and dG along (``grads_state``:
the terms of the chunk states; ``grads_pairs``: the pair sums of dL and dP in their row and column forms, a
sub-chunk at a time, completing dq, dk and dg). Fused into one kernel the state terms and the pair sums do not fit
in registers: it took 8.1 ms at B=8, T=4096, H=16, K=V=128 on an H200 where the parts took 1.2, 1.9 and 1.9 ms
alone (the pair sums then in a row and a column kernel on whole chunk tiles). Between the two, ``grads_diag`` adds,
for the chunks whose decay inside a sub-chunk is too strong for the diagonal blocks' dots (the forward flags them),
those blocks' share of both forms, exactly.

    dV = Diag(beta) dY,  dbeta_i = sum_v Z_iv dY_iv + sum_j dL_ij A_ij
    dL = -strictly_lower(dY U^T)      (from dT = dU Y^T: dL = -T^T dT T^T = -dY (T Y)^T)
    dP = lower(dO U^T),  dA = Diag(beta) dL
    dQg = dO h^T,  dKd = U dh^T,  dKg = -Diag(beta) dY h^T,  dgamma = rowsum(h * dh)

and the decayed pair sums of ``subchunk`` turn dA and dP into gradients of q, k and of the cumulative
log-decay G (every factor ``x e^{+-G}`` contributes ``+-x * dx`` to dG). ``Z`` itself is never formed:
``sum_v Z dY = sum_v V dY - sum_d Kg (dY h^T)``. The gradient of G is reverse-cumulated within the
chunk (the cumulative sum's adjoint) and, with ``use_gate_in_kernel``, chained through the gate.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

from ..chunk.prepared import PreparedKeys
from ..chunk.scaled import (
    Stored,
    allocate,
    load_rows_scaled,
    load_tile_scaled_blocks,
    scaled_back,
    store_tile_scaled,
)
from ..chunk.segments import Segments, Transitions, run
from ..chunk.state import (
    block_gammas,
    block_scales,
    launch_serial,
    load_blocks,
    load_state,
    read_blocks,
    serial_chunk,
    serial_config,
    serial_program,
    store_blocks,
    update_blocks,
)
from ..chunk.tiles import (
    chunk_span,
    decay,
    key_head,
    load_gate,
    load_gate_row,
    load_rows,
    load_rowvec,
    load_tile,
    row_offsets,
    selected,
    store_tile,
    tf32_nearest,
    tile_ptrs,
)
from ..common import Chunks, Selection, launch, launch_only, padded, tma_operands, use_tma
from .blocks import pair_decays
from .chunk_fwd import SUB
from .gate import gate_backward_tile
from .subchunk import diag_precision, diag_source_row, sub_colform, sub_diag, sub_rowform, sub_rows


@triton.jit
def dstate_kernel(qg, sq_ptr, kg, sg_ptr, kd, sd_ptr, G_ptr, beta_ptr, T, t_s_ptr, P, do_ptr, dht_ptr,
                  dh_ptr, dh_s_ptr, dy_ptr, dy_s_ptr, dh0_ptr, cu_ptr, off_ptr, sel_ptr, scale, H, K, V, W,
                  C: tl.constexpr, KB: tl.constexpr, NKB: tl.constexpr, SB: tl.constexpr, NSB: tl.constexpr,
                  BV: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, STEPS: tl.constexpr,
                  SCALED: tl.constexpr, T_SCALED: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr,
                  SELECT: tl.constexpr, SCALAR: tl.constexpr, GROUP: tl.constexpr):
    """One value block, sequence and head: the state gradient, last chunk first, in NKB blocks; with
    ``STEPS``, dh and dY of every chunk, with ``SCALED`` row-scaled (``chunk.scaled``, scales at ``dh_s_ptr``,
    ``dy_s_ptr``). ``Qg``, ``Kg``, ``Kd`` prepared (``chunk.prepared``); T with ``T_SCALED`` row-scaled (scales at
    ``t_s_ptr``, ``chunk_fwd.intra``). They, P and T are pointers, or with ``TMA``
    descriptors (``tiles.load_rows``): dO, through pointers, is zero past a sequence's end, so ``P^T dO`` is too
    (P is lower triangular), and the prepared operands' zero row scales drop their rows there. The gradient
    has W >= V columns (dht and dh0 ``[N, H, K, W]``), dO V: the columns past V start from dht and take a
    zero dO (``chunk.segments``' transitions). With ``SELECT`` the sequences listed at sel_ptr only. ``SCALAR``: G a
    ``[T, H]`` gate, the prepared operands with ``H / GROUP`` heads (``chunk_fwd.recurrence_kernel``'s)."""
    nh, h, bos, eos, c_first, vv, vmask = serial_program(cu_ptr, off_ptr, H, V, BV, sel_ptr, SELECT)
    hk, HK = key_head(h, H, GROUP)
    wmask = vv < W
    dS0, dS1, dS2, dS3 = load_blocks(dht_ptr, nh, K, W, KB, NKB, BV, vv, wmask, HAS_DHT)
    num = tl.cdiv(eos - bos, C)
    for back in range(num):
        it = num - 1 - back
        t0, rows, rmask, grows, last = serial_chunk(bos, eos, it, C)
        sq0, sq1, sq2, sq3 = block_scales(sq_ptr, rows, rmask, h, H, NSB, KB, SB, NKB)
        sd0, sd1, sd2, sd3 = block_scales(sd_ptr, rows, rmask, h, H, NSB, KB, SB, NKB)
        sg0, sg1, sg2, sg3 = block_scales(sg_ptr, rows, rmask, h, H, NSB, KB, SB, NKB)
        g0, g1, g2, g3 = block_gammas(G_ptr, last, h, H, K, KB, NKB, SCALAR)
        beta = load_rowvec(beta_ptr, rows, rmask, h, H)
        if STEPS:
            store_blocks(dh_ptr, dS0, dS1, dS2, dS3, (c_first + it) * H + h, K, V, KB, NKB, vv, vmask, 0, dh_s_ptr,
                         SCALED)
        do = load_tile(do_ptr, rows, rmask, h, H, V, vv, vmask)
        Pc = load_rows(P, t0, rows, rmask, h, H, C, 0, C, TMA)
        dU = read_blocks(dS0, dS1, dS2, dS3, tl.dot(tl.trans(Pc), do, input_precision=PREC), kd, sd0, sd1, sd2, sd3,
                         t0, rows, rmask, hk, HK, K, KB, NKB, FIRST=False, PREC=PREC, TMA=TMA)
        # the dO term before dY is formed, so that the dO tile dies before the dY tile lives: spilled stack 160 -> 80
        # B a thread (Triton 3.6, sm_90), B=8 1.33 -> 1.26 ms, B=1 over segments 3.49 -> 3.32 (H100, bf16, H=16,
        # K=V=128, at 4656b7e)
        dS0, dS1, dS2, dS3 = update_blocks(dS0, dS1, dS2, dS3, scale * do, qg, sq0, sq1, sq2, sq3, g0, g1, g2, g3,
                                           t0, rows, rmask, hk, HK, K, KB, NKB, DECAY=True, FIRST=False,
                                           PREC=PREC, TMA=TMA)
        Tc = load_rows_scaled(T, t_s_ptr, t0, rows, rmask, h, H, C, 0, C, C, 1, T_SCALED, TMA)
        dY = tl.dot(tl.trans(Tc), dU, input_precision=PREC)
        if STEPS:
            store_tile_scaled(dy_ptr, dy_s_ptr, dY, rows, rmask, h, H, V, vv, vmask, SCALED)
        dS0, dS1, dS2, dS3 = update_blocks(dS0, dS1, dS2, dS3, -beta[:, None] * dY, kg, sg0, sg1, sg2, sg3, g0, g1,
                                           g2, g3, t0, rows, rmask, hk, HK, K, KB, NKB, DECAY=False, FIRST=False,
                                           PREC=PREC, TMA=TMA)
    if STORE_DH0:
        store_blocks(dh0_ptr, dS0, dS1, dS2, dS3, nh, K, W, KB, NKB, vv, wmask)


@triton.jit
def grads_v_kernel(v_ptr, beta_ptr, u_ptr, u_s_ptr, dy_ptr, dy_s_ptr, do_ptr, dv_ptr, dL_ptr, dP_ptr, dbeta_ptr,
                   cu_ptr, seq_ptr, start_ptr, sel_ptr, H, V, U_NSB, DY_NSB, C: tl.constexpr, BV: tl.constexpr,
                   U_SB: tl.constexpr, DY_SB: tl.constexpr, SCALED: tl.constexpr, PREC: tl.constexpr,
                   SELECT: tl.constexpr):
    """One chunk and head, the value side: dv, ``dP = lower(dO U^T)``, ``dL = -strictly_lower(dY U^T)``
    (both stored, fp32 ``[T, H, C]``) and dbeta's value part ``sum_v V dY``. U and dY row-scaled where
    ``SCALED`` (``chunk.scaled``: blocks of ``*_SB`` columns, ``*_NSB`` of them; a tile of BV columns may span
    several, ``scaled.load_tile_scaled_blocks``). ``SELECT``: the chunks listed at sel_ptr (``common.Selection``)."""
    c = selected(tl.program_id(0), sel_ptr, SELECT)
    h = tl.program_id(1)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    i = tl.arange(0, C)
    ii = i[:, None]
    jj = i[None, :]
    rows = t0 + i
    rmask = i < n
    beta = load_rowvec(beta_ptr, rows, rmask, h, H)
    cv = tl.arange(0, BV)
    dP = tl.zeros((C, C), tl.float32)
    dYU = tl.zeros((C, C), tl.float32)
    dbeta = tl.zeros((C,), tl.float32)
    for v0 in range(0, V, BV):
        vmask = v0 + cv < V
        if SCALED:
            U = load_tile_scaled_blocks(u_ptr, u_s_ptr, rows, rmask, h, H, V, v0, vmask, U_SB, U_NSB, BV)
            dY = load_tile_scaled_blocks(dy_ptr, dy_s_ptr, rows, rmask, h, H, V, v0, vmask, DY_SB, DY_NSB, BV)
        else:
            U = load_tile(u_ptr + v0, rows, rmask, h, H, V, cv, vmask)
            dY = load_tile(dy_ptr + v0, rows, rmask, h, H, V, cv, vmask)
        do = load_tile(do_ptr + v0, rows, rmask, h, H, V, cv, vmask)
        v = load_tile(v_ptr + v0, rows, rmask, h, H, V, cv, vmask)
        dP += tl.dot(do, tl.trans(U), input_precision=PREC)
        dYU += tl.dot(dY, tl.trans(U), input_precision=PREC)
        dbeta += tl.sum(v * dY, axis=1)
        store_tile(dv_ptr + v0, beta[:, None] * dY, rows, rmask, h, H, V, cv, vmask)
    store_tile(dP_ptr, tl.where(ii >= jj, dP, 0.0), rows, rmask, h, H, C, i, i < C)
    store_tile(dL_ptr, tl.where(ii > jj, -dYU, 0.0), rows, rmask, h, H, C, i, i < C)
    tl.store(dbeta_ptr + rows.to(tl.int64) * H + h, dbeta, mask=rmask)


@triton.jit
def key_program(K, BK: tl.constexpr, sel_ptr, SELECT: tl.constexpr):
    """``(c, kb, h)``: the chunk, channel block and head of a key-side program (axis 0 ``chunk * NKB + block``, axis 1
    the head). The channel blocks of a chunk run side by side, so that the tiles each of them reads whole (U, dY, dO,
    the ``[C, C]`` dL and dP) come from DRAM once and from L2 after: with the chunk on axis 0 and the block on axis 2
    they were read once per block (H100, bf16, B=8, T=4096, H=16, K=V=128, ncu: DRAM traffic of ``grads_state`` 5.30
    -> 3.11 GB, the pair sums' row and column kernels 3.48 -> 2.63 and 2.61 -> 1.76; together 6.12 -> 5.62 ms, at
    6544004). ``SELECT``: the chunks listed at sel_ptr (``common.Selection``)."""
    nkb = tl.cdiv(K, BK)
    return selected(tl.program_id(0) // nkb, sel_ptr, SELECT), tl.program_id(0) % nkb, tl.program_id(1)


@triton.jit
def key_block(q_ptr, k_ptr, G_ptr, cu_ptr, seq_ptr, start_ptr, sel_ptr, H, K, C: tl.constexpr, BK: tl.constexpr,
              SELECT: tl.constexpr, SCALAR: tl.constexpr, GROUP: tl.constexpr):
    """The tiles of one channel block and chunk and head (``key_program``) that ``grads_state_kernel`` starts from:
    ``(c, h, kb, t0, n, rows, rmask, ck, kmask, k0, k, q, G, G_last)``, G in its dtype (fp64 for fp32 inputs): a
    ``[T, H, K]`` gate's tile, or with ``SCALAR`` a ``[T, H]`` gate's broadcast over the block; q and k with
    ``H / GROUP`` heads (``tiles.key_head``)."""
    c, kb, h = key_program(K, BK, sel_ptr, SELECT)
    hk, HK = key_head(h, H, GROUP)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    i = tl.arange(0, C)
    rows = t0 + i
    rmask = i < n
    k0 = kb * BK
    ck = tl.arange(0, BK)
    kmask = k0 + ck < K
    k = load_tile(k_ptr + k0, rows, rmask, hk, HK, K, ck, kmask)
    q = load_tile(q_ptr + k0, rows, rmask, hk, HK, K, ck, kmask)
    cols = k0 + ck
    G = load_gate(G_ptr, t0 + tl.minimum(i, n - 1), i < C, h, H, K, cols, kmask, SCALAR)
    G_last = load_gate_row(G_ptr, t0 + n - 1, h, H, K, cols, kmask, SCALAR)
    return c, h, kb, t0, n, rows, rmask, ck, kmask, k0, k, q, G, G_last


@triton.jit
def grads_state_kernel(q_ptr, k_ptr, G_ptr, beta_ptr, hs, hs_s_ptr, dh, dh_s_ptr, U, u_s_ptr, dY, dy_s_ptr, dO, dq_ptr,
                       dk_ptr, dG_ptr, dbeta_ptr, cu_ptr, seq_ptr, start_ptr, sel_ptr, scale, H, K, V, TOTAL, F_SB,
                       F_NSB, B_SB, B_NSB, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALED: tl.constexpr,
                       PREC: tl.constexpr, TMA: tl.constexpr, SELECT: tl.constexpr, SCALAR: tl.constexpr,
                       GROUP: tl.constexpr):
    """Key side, part 1 (the state terms): ``dQg = dO h^T``, ``dKd = U dh^T``, ``dYh = dY h^T`` and
    ``dgamma = rowsum(h * dh)`` turned into the first fp32 partials of dq, dk and dG (at ``dq_ptr``,
    ``dk_ptr``, ``dG_ptr``) and dbeta's share of this channel block. h and U (the forward pass's: ``F_*``),
    dh and dY (the reverse pass's: ``B_*``) row-scaled where ``SCALED`` (``chunk.scaled``: blocks of ``*_SB >= BV``
    columns). hs, dh, U, dY and dO are pointers, or with ``TMA`` descriptors (``state.load_state``,
    ``tiles.load_rows``): their rows past the chunk's end reach only rows of the partials that are not stored, and
    the sums over rows weigh them by k's zeros there. ``SELECT``: the chunks listed at sel_ptr (``key_program``);
    ``SCALAR``, ``GROUP``: a ``[T, H]`` gate, q and k with ``H / GROUP`` heads (``key_block``)."""
    c, h, kb, t0, n, rows, rmask, ck, kmask, k0, k, q, G, G_last = key_block(
        q_ptr, k_ptr, G_ptr, cu_ptr, seq_ptr, start_ptr, sel_ptr, H, K, C, BK, SELECT, SCALAR, GROUP)
    i = tl.arange(0, C)
    cv = tl.arange(0, BV)
    dQg = tl.zeros((C, BK), tl.float32)
    dKd = tl.zeros((C, BK), tl.float32)
    dYh = tl.zeros((C, BK), tl.float32)
    dgamma = tl.zeros((BK,), tl.float32)
    idx = c * H + h
    state_row = (idx.to(tl.int64)) * K + k0 + ck   # the rows of this channel block in the [NC, H, K, *] arrays
    for v0 in range(0, V, BV):
        vv = v0 + cv
        vmask = vv < V
        hsb = scaled_back(load_state(hs, idx, K, V, kb, BK, BV, vv, vmask, True, TMA, v0), hs_s_ptr + state_row * F_NSB,
                          kmask, v0, F_SB, SCALED)
        dhb = scaled_back(load_state(dh, idx, K, V, kb, BK, BV, vv, vmask, True, TMA, v0), dh_s_ptr + state_row * B_NSB,
                          kmask, v0, B_SB, SCALED)
        dQg += tl.dot(load_rows(dO, t0, rows, rmask, h, H, V, v0, BV, TMA), tl.trans(hsb), input_precision=PREC)
        Ub = load_rows_scaled(U, u_s_ptr, t0, rows, rmask, h, H, V, v0, BV, F_SB, F_NSB, SCALED, TMA)
        dKd += tl.dot(Ub, tl.trans(dhb), input_precision=PREC)
        dYb = load_rows_scaled(dY, dy_s_ptr, t0, rows, rmask, h, H, V, v0, BV, B_SB, B_NSB, SCALED, TMA)
        dYh += tl.dot(dYb, tl.trans(hsb), input_precision=PREC)
        dgamma += tl.sum(hsb * dhb, axis=1)
    eG = decay(G)
    dq = scale * eG * dQg
    dKg = -load_rowvec(beta_ptr, rows, rmask, h, H)[:, None] * eG * dYh  # through Kg = k e^G (Z = V - Kg S0)
    dKd_d = decay(G_last[None, :] - G) * dKd                              # through Kd = k e^{G_last - G}
    dG = q * dq + k * (dKg - dKd_d)
    dG += tl.where(i[:, None] == n - 1, (tl.sum(k * dKd_d, axis=0) + decay(G_last) * dgamma)[None, :], 0.0)
    store_tile(dq_ptr + k0, dq, rows, rmask, h, H, K, ck, kmask)
    store_tile(dk_ptr + k0, dKg + dKd_d, rows, rmask, h, H, K, ck, kmask)
    store_tile(dG_ptr + k0, dG, rows, rmask, h, H, K, ck, kmask)
    tl.store(dbeta_ptr + ((1 + kb).to(tl.int64) * TOTAL + rows) * H + h, -tl.sum(k * eG * dYh, axis=1), mask=rmask)


@triton.jit
def diag_by_dots(flag_ptr, c, h, H, SAFE: tl.constexpr):
    """Whether the pair sums take the diagonal blocks' pairs by dots: always under safe_gate, else where
    the forward did not flag the chunk (``chunk_fwd.intra``: a bit per sub-chunk whose decay was too strong for them;
    ``grads_diag_kernel`` sums a flagged chunk's exactly)."""
    if SAFE:
        dots = True
    else:
        dots = tl.load(flag_ptr + c.to(tl.int64) * H + h) == 0
    return dots


@triton.jit
def grads_pairs_kernel(q_ptr, k_ptr, g_ptr, G_ptr, beta_ptr, dL_ptr, dP_ptr, flag_ptr, alog_ptr, bias_ptr, dqp_ptr,
                       dkp_ptr, dGp_ptr, dq_ptr, dk_ptr, dg_ptr, dbeta_ptr, da_ptr, ddt_ptr, cu_ptr, seq_ptr, start_ptr,
                       sel_ptr, scale, lower_bound, H, K, TOTAL, C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                       SAFE: tl.constexpr, USE_GATHER: tl.constexpr, PREC: tl.constexpr, DPREC: tl.constexpr,
                       USE_GATE: tl.constexpr, HAS_BIAS: tl.constexpr, USE_LB: tl.constexpr, SELECT: tl.constexpr):
    """Key side, part 2 (the pair sums), one channel block of a chunk (program axis 0, ``chunk * NKB + block``) and
    head, a sub-chunk at a time from the last (``subchunk``): the row form ``R_L, R_P`` of dL and dP and the column
    form ``Qc``, then ``dq = dq' + scale R_P``, ``dk = dk' + Diag(beta) R_L + Qc``, ``dG = dG' + q scale R_P +
    k (Diag(beta) R_L - Qc)`` from the partials, dbeta's share of the block, the reverse cumulative sum of dG over the
    chunk (the sums of the sub-chunks after carried along) and, with ``USE_GATE``, the gate's backward. ``SELECT``: the
    chunks listed at sel_ptr (``key_program``)."""
    c, kb, h = key_program(K, BK, sel_ptr, SELECT)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    d = kb * BK + tl.arange(0, BK)
    dmask = d < K
    diag = diag_by_dots(flag_ptr, c, h, H, SAFE)
    rate = 1.0
    if USE_GATE:
        rate = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    after = tl.zeros((BK,), tl.float32)   # dG summed over the rows after the sub-chunk
    da = tl.zeros((BK,), tl.float32)
    ddt = tl.zeros((BK,), tl.float32)
    nsub = tl.cdiv(n, BC)
    for back in range(nsub):
        s = nsub - 1 - back
        _, rows, live, grows = sub_rows(t0, n, s, BC)
        k = load_tile(k_ptr, rows, live, h, H, K, d, dmask)
        q = load_tile(q_ptr, rows, live, h, H, K, d, dmask)
        G = load_gate(G_ptr, grows, grows >= 0, h, H, K, d, dmask)
        beta = load_rowvec(beta_ptr, rows, live, h, H)
        R_L, R_P = sub_rowform(dL_ptr, dP_ptr, k_ptr, G_ptr, G, t0, n, s, h, H, K, d, dmask, C, BC, USE_GATHER, PREC)
        Qc = sub_colform(dL_ptr, dP_ptr, q_ptr, k_ptr, G_ptr, beta_ptr, G, t0, n, s, scale, h, H, K, d, dmask, C, BC,
                         USE_GATHER, PREC)
        r_L, r_P, q_c = sub_diag(dL_ptr, dP_ptr, k, beta[:, None] * k, scale * q, G, G_ptr, t0, n, s, h, H, K, d,
                                 dmask, diag, C, BC, USE_GATHER, DPREC)
        R_L += r_L
        R_P += r_P
        Qc += q_c
        dq_row = scale * R_P
        dk_row = beta[:, None] * R_L
        store_tile(dq_ptr, load_tile(dqp_ptr, rows, live, h, H, K, d, dmask) + dq_row, rows, live, h, H, K, d, dmask)
        store_tile(dk_ptr, load_tile(dkp_ptr, rows, live, h, H, K, d, dmask) + dk_row + Qc, rows, live, h, H, K, d,
                   dmask)
        dG = load_tile(dGp_ptr, rows, live, h, H, K, d, dmask) + q * dq_row + k * (dk_row - Qc)
        slot = dbeta_ptr + ((1 + kb).to(tl.int64) * TOTAL + rows) * H + h
        tl.store(slot, tl.load(slot, mask=live, other=0.0) + tl.sum(k * R_L, axis=1), mask=live)
        dgate = tl.cumsum(dG, axis=0, reverse=True) + after[None, :]
        after += tl.sum(dG, axis=0)
        if USE_GATE:
            da_s, ddt_s = gate_backward_tile(dgate, g_ptr, bias_ptr, dg_ptr, rows, live, d, dmask, h, H, K, rate,
                                             lower_bound, HAS_BIAS, USE_LB)
            da += da_s
            ddt += ddt_s
        else:
            store_tile(dg_ptr, dgate, rows, live, h, H, K, d, dmask)
    if USE_GATE:
        tl.store(da_ptr + (c * H + h) * tl.cdiv(K, BK) + kb, tl.sum(da, axis=0))
        tl.store(ddt_ptr + (c.to(tl.int64) * H + h) * K + d, ddt, mask=dmask)


@triton.jit
def scalar_pairs_kernel(q_ptr, k_ptr, G_ptr, beta_ptr, dL_ptr, dP_ptr, dqp_ptr, dkp_ptr, dGp_ptr, dq_ptr, dk_ptr,
                        dg_ptr, dbeta_ptr, cu_ptr, seq_ptr, start_ptr, sel_ptr, scale, H, K, TOTAL, C: tl.constexpr,
                        BK: tl.constexpr, PREC: tl.constexpr, SELECT: tl.constexpr, GROUP: tl.constexpr):
    """Key side, part 2, for a ``[T, H]`` gate G (one decay per head: Gated DeltaNet), one chunk and head: the pair
    sums with the decay out of them. With ``D_ij = e^{G_i - G_j}`` (``blocks.pair_decays``), ``A = (K K^T) o D``,
    ``P = scale (Q K^T) o D``, ``W_L = Diag(beta) dL o D`` and ``W_P = scale dP o D``:

        dq = dq' + W_P K,    dk = dk' + (W_L + W_L^T) K + W_P^T Q,    dbeta += rowsum(dL o A)
        dG = sum_d dG'  + rowsum(M) - colsum(M),   M = W_L o (K K^T) + W_P o (Q K^T)

    (each ``e^{G_i - G_j}`` gives ``+M_ij`` to ``dG_i`` and ``-M_ij`` to ``dG_j``), then dg, the reverse cumulative sum
    of dG over the chunk, ``[T, H]`` fp32. Every ``[C, C]`` product over the channels is a dot, for any decay: no
    sub-chunks, no exact rows. q and k have ``H / GROUP`` heads (``tiles.key_head``), the gradients H. ``SELECT``: the
    chunks listed at sel_ptr (``common.Selection``)."""
    c = selected(tl.program_id(0), sel_ptr, SELECT)
    h = tl.program_id(1)
    hk, HK = key_head(h, H, GROUP)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    i = tl.arange(0, C)
    rows = t0 + i
    live = i < n
    KK = tl.zeros((C, C), tl.float32)
    QK = tl.zeros((C, C), tl.float32)
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        cmask = cols < K
        k = tf32_nearest(load_tile(k_ptr, rows, live, hk, HK, K, cols, cmask), PREC)
        q = tf32_nearest(load_tile(q_ptr, rows, live, hk, HK, K, cols, cmask), PREC)
        KK += tl.dot(k, tl.trans(k), input_precision=PREC)
        QK += tl.dot(q, tl.trans(k), input_precision=PREC)
    G = tl.load(G_ptr + row_offsets(t0 + tl.minimum(i, n - 1), h, H, 1))
    beta = load_rowvec(beta_ptr, rows, live, h, H)
    dL = load_tile(dL_ptr, rows, live, h, H, C, i, i < C)
    D = pair_decays(G, i, True)
    tl.store(dbeta_ptr + (TOTAL + rows.to(tl.int64)) * H + h,
             tl.load(dbeta_ptr + (TOTAL + rows.to(tl.int64)) * H + h, mask=live, other=0.0)
             + tl.sum(dL * (KK * D), axis=1), mask=live)
    W_L = beta[:, None] * dL * D
    M = W_L * KK
    W_P = scale * load_tile(dP_ptr, rows, live, h, H, C, i, i < C) * pair_decays(G, i, False)
    M += W_P * QK
    dG = tl.sum(M, axis=1) - tl.sum(M, axis=0)
    W_L = tf32_nearest(W_L, PREC)
    W_P = tf32_nearest(W_P, PREC)
    W_S = W_L + tl.trans(W_L)
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        cmask = cols < K
        k = tf32_nearest(load_tile(k_ptr, rows, live, hk, HK, K, cols, cmask), PREC)
        q = tf32_nearest(load_tile(q_ptr, rows, live, hk, HK, K, cols, cmask), PREC)
        dq = load_tile(dqp_ptr, rows, live, h, H, K, cols, cmask) + tl.dot(W_P, k, input_precision=PREC)
        store_tile(dq_ptr, dq, rows, live, h, H, K, cols, cmask)
        dk = load_tile(dkp_ptr, rows, live, h, H, K, cols, cmask) + tl.dot(W_S, k, input_precision=PREC)
        dk = tl.dot(tl.trans(W_P), q, dk, input_precision=PREC)
        store_tile(dk_ptr, dk, rows, live, h, H, K, cols, cmask)
        dG += tl.sum(load_tile(dGp_ptr, rows, live, h, H, K, cols, cmask), axis=1)
    dG = tl.where(live, dG, 0.0)
    tl.store(dg_ptr + row_offsets(rows, h, H, 1), tl.cumsum(dG, axis=0, reverse=True), mask=live)


@triton.jit
def diag_block_grads(q_ptr, k_ptr, G_ptr, beta_ptr, dL_ptr, dP_ptr, dq_ptr, dk_ptr, dG_ptr, dbeta_ptr, t0, n, b, kb,
                     h, scale, H, K, TOTAL, C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """``grads_diag_kernel``'s work on sub-chunk b and channel block kb."""
    i, rows, live, grows = sub_rows(t0, n, b, BC)
    d = kb * BK + tl.arange(0, BK)
    dmask = d < K
    G = load_gate(G_ptr, grows, grows >= 0, h, H, K, d, dmask)
    mrow = (rows.to(tl.int64) * H + h) * C
    R1 = tl.zeros((BC, BK), tl.float32)
    R2 = tl.zeros((BC, BK), tl.float32)
    Q = tl.zeros((BC, BK), tl.float32)
    for j in range(b * BC, tl.minimum(b * BC + BC, n)):
        row = (t0 + j).to(tl.int64) * H + h
        mj = row * C + i  # row j of dL, dP at the sub-chunk's columns
        beta_j = tl.load(beta_ptr + row).to(tl.float32)
        r1, r2, qc = diag_source_row(G, i, j, tl.load(k_ptr + row * K + d, mask=dmask, other=0.0).to(tl.float32),
                                     tl.load(q_ptr + row * K + d, mask=dmask, other=0.0).to(tl.float32),
                                     tl.load(G_ptr + row * K + d, mask=dmask, other=0.0),
                                     tl.load(dL_ptr + mrow + j, mask=live & (i >= j), other=0.0),
                                     tl.load(dP_ptr + mrow + j, mask=live & (i >= j), other=0.0),
                                     beta_j * tl.load(dL_ptr + mj, mask=i <= j, other=0.0),
                                     scale * tl.load(dP_ptr + mj, mask=i <= j, other=0.0))
        R1 += r1
        R2 += r2
        Q += qc
    k = load_tile(k_ptr, rows, live, h, H, K, d, dmask)
    dq_row = scale * R2
    dk_row = load_rowvec(beta_ptr, rows, live, h, H)[:, None] * R1
    m = live[:, None] & dmask[None, :]
    p = tile_ptrs(dq_ptr, rows, h, H, K, d)
    tl.store(p, tl.load(p, mask=m) + dq_row, mask=m)
    p = tile_ptrs(dk_ptr, rows, h, H, K, d)
    tl.store(p, tl.load(p, mask=m) + dk_row + Q, mask=m)
    p = tile_ptrs(dG_ptr, rows, h, H, K, d)
    tl.store(p, tl.load(p, mask=m) + load_tile(q_ptr, rows, live, h, H, K, d, dmask) * dq_row + k * (dk_row - Q),
             mask=m)
    slot = dbeta_ptr + ((1 + kb).to(tl.int64) * TOTAL + rows) * H + h
    tl.store(slot, tl.load(slot, mask=live) + tl.sum(k * R1, axis=1), mask=live)


@triton.jit
def grads_diag_kernel(q_ptr, k_ptr, G_ptr, beta_ptr, dL_ptr, dP_ptr, flag_ptr, dq_ptr, dk_ptr, dG_ptr, dbeta_ptr,
                      cu_ptr, seq_ptr, start_ptr, sel_ptr, scale, H, K, TOTAL, C: tl.constexpr, BC: tl.constexpr,
                      BK: tl.constexpr, SELECT: tl.constexpr):
    """Key side, between parts 1 and 2, for the chunks the forward flagged (``diag_by_dots``; the others return at once:
    one program per chunk and head, so that at normal decay the launch costs little): every sub-chunk and channel
    block in turn, the share of its diagonal block in the row and column forms, exactly, one source row j after
    another into every row of the sub-chunk at once (``subchunk.diag_source_row``: no reduction, the rows of j from
    memory), then added to the partials of dq, dk and dG and to dbeta's share of the channel block as
    ``grads_pairs_kernel`` adds its own (dG's ``-k Qc`` before its reverse cumulative sum). ``SELECT``: the chunks listed
    at sel_ptr (``common.Selection``)."""
    c = selected(tl.program_id(0), sel_ptr, SELECT)
    h = tl.program_id(1)
    if tl.load(flag_ptr + c.to(tl.int64) * H + h) != 0:
        t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
        for kb in range(tl.cdiv(K, BK)):
            for b in range(tl.cdiv(n, BC)):
                diag_block_grads(q_ptr, k_ptr, G_ptr, beta_ptr, dL_ptr, dP_ptr, dq_ptr, dk_ptr, dG_ptr, dbeta_ptr, t0,
                                 n, b, kb, h, scale, H, K, TOTAL, C, BC, BK)


SCALAR_PAIRS_LAUNCH = dict(BK=64, num_warps=8)
"""``scalar_pairs_kernel``'s launch (``[64, BK]`` tiles of q and k, ``[64, 64]`` pair matrices). Not tuned yet: 3.23 ms
of a GDN forward and backward of 11.62 on an H200 (bf16, B=8, T=4096, 16/32 heads, K=V=128;
``benchmarks/results/gdn_prefill_h200.json``, ``kernels_ms``), where KDA's pair sums over the gate broadcast
(``grads_pairs_kernel``) took 4.82 ms (docs/kernels/gated_delta_rule.md)."""
PAIRS_LAUNCH = dict(num_warps=2, num_stages=2, maxnreg=168)
"""``grads_pairs_kernel``'s launch (``[16, BK]`` tiles; its channel blocks are the key side's, ``BK``). Measured on an H200
(bf16, B=8, T=4096, H=16, K=V=128, the four gradient kernels together, safe_gate off / on, at 09143eb): 4.038 /
3.880 ms here; uncapped at 2 warps (255 registers) 4.471 / 4.573,
capped at 128 registers 4.591 / 4.181, at 192 4.583 / 4.432; 1 warp 4.033 / 3.954, 4 warps 6.026 / 6.211, 8 warps
10.46 / 10.94; one load stage 4.807 / 5.094, three 4.485 / 4.542; channel
blocks of 64 (grads_state's too) at 2 warps 4.139 / 4.061. The row and column kernels it replaced took 3.447 / 3.410
ms where it takes 2.526 / 2.427 (B=8, ``kernels_ms``, at 0ae2b67); its diagonal dots
run without a branch on the flag (the flagged chunks' blocks and exponents zeroed, ``subchunk.sub_diag``): behind
``if`` they cost 0.30 ms more at normal decay (2.827 ms) and 0.26 less under strong decay, where ``grads_diag_kernel``
adds those blocks. That kernel's loop moved into this one (``sub_diag`` or the exact sum per sub-chunk) took 3.281 ms
at normal decay and 4.402 under strong decay against 2.179 + 1.708 (at 0ae2b67)."""
DIAG_LAUNCH = dict(num_warps=2)
"""``grads_diag_kernel``'s launch (``[16, BK]`` tiles). Measured on an H200 (bf16, B=8, T=4096, H=16, K=V=128, strong decay,
the gradient kernels together, at 835f7c4): 5.890 ms at 2 warps, 6.021 at 4, 7.034 at 1.
With a program per sub-chunk and channel block it took 0.08 ms at normal decay, where every program returns at once
(H100, at 9503e45)."""


def dstate_launch(over: Chunks, H: int, K: int, W: int, config: dict | None) -> dict:
    """The reverse pass's launch over ``over`` for a gradient of W columns: ``state.serial_config`` with two load
    stages and value blocks of at most 32, unless ``config`` says otherwise. With its row blocks through TMA
    (``common.tma_operands``), measured on an H100 (bf16, H=16, K=V=128, at c31a24a): B=8,
    T=4096 0.889 ms at 32 values and two stages, 1.109 at 64 and one stage (the default before TMA), 1.248 at 64 and
    two; B=1, T=32768 in one pass, 16 values and two stages (as before) 2.028 ms."""
    cfg = serial_config(over, H, K, W, dict(num_stages=2) | launch_only(config))
    return cfg | (dict(BV=min(cfg["BV"], 32)) if "BV" not in (config or {}) else {})


def dstate(keys: PreparedKeys, G, beta, T: Stored, P, do, dht, chunks: Chunks, scale: float, precision: str,
           want_dh0: bool, scaled: bool = False, segments: Segments | None = None,
           transitions: Transitions | None = None, config: dict | None = None, select: Selection | None = None,
           stored: tuple[Stored, Stored, torch.Tensor | None] | None = None):
    """``(dh [NC, H, K, V], dY [T, H, V], dh0 [N, H, K, V] or None)``: dh and dY ``scaled.Stored``, fp32 or with
    ``scaled`` row-scaled fp16 (``chunk.scaled``: for "tf32" dots only), dh0 fp32; on the operands
    prepared from k, q and G (``chunk.prepared``). ``segments``: the sequences cut into segments that run side
    by side (``chunk.segments``); ``transitions``: the forward pass's over them, whose maps transposed are this
    pass's (``chunk.segments.run``'s ``maps``). ``config`` overrides the launch (``BV``, ``TMA``, ``num_warps``,
    ``num_stages``; ``KB``: the state blocks' rows, at most the operands' scale block). Blocks of 64 by default: 128 took
    0.913 ms against 0.820 at B=8 and 1.245 against 1.117 in varlen (H200, bf16, H=16, K=V=128, one dot where two
    were each waited for, but 200 B a thread spilled offline; at 56d920f).
    ``select`` (without segments): the sequences of a ``Selection`` only, into ``stored`` (dh, dY, dh0) where given
    (``dstate_outputs``; the backward's passes by sequence groups, ``api``). G ``[T, H]``: one decay per head, the
    prepared operands with fewer heads than dO (``chunk_fwd.recurrence``'s)."""
    total, H, V = do.shape
    K = keys.kg.shape[-1]
    dev = do.device
    f32 = torch.float32
    config = dict(config or {})
    width = config.pop("KB", 64)
    dh, dY, dh0 = stored or dstate_outputs(keys, do, chunks, scaled, want_dh0 and segments is None, segments, config)
    KB, C = keys.state_rows(width), chunks.size
    # dO through TMA (its rows past a sequence set to zero) and dh stored through TMA: B=8 0.890 -> 1.299 ms, B=1 from
    # the forward's maps 1.891 -> 2.254 (H100, at 0755dc7); not kept
    tma, (qg, kg, kd, Pd, Td) = tma_operands(config, *((x, [C, 1, KB]) for x in (keys.qg, keys.kg, keys.kd)),
                                             (P, [C, 1, C]), (T.data, [C, 1, C]))

    def walk(over: Chunks, end, W: int, steps: bool, store_dh0: bool | None = None, into: torch.Tensor | None = None):
        store_dh0 = not steps if store_dh0 is None else store_dh0
        dh0 = into if into is not None or not store_dh0 else torch.empty(over.num_seqs, H, K, W, device=dev, dtype=f32)
        launch_serial(dstate_kernel,
                      (qg, keys.sq, kg, keys.sg, kd, keys.sd, G, beta, Td, T.scale_ptr(), Pd, do,
                       end if end is not None else do, dh.data, dh.scale_ptr(), dY.data, dY.scale_ptr(),
                       dh0 if store_dh0 else do, over.cu, over.offsets, over.cu if select is None else select.seqs,
                       scale, H, K, V, W),
                      dict(HAS_DHT=end is not None, STORE_DH0=store_dh0, STEPS=steps, SCALED=scaled,
                           T_SCALED=T.scaled, PREC=precision, TMA=tma, SELECT=select is not None, SCALAR=G.dim() == 2,
                           GROUP=H // keys.kg.shape[1]) | keys.constexprs,
                      over, H, K, W, dstate_launch(over, H, K, W, config), max_block=KB, select=select)
        return dh0

    if segments is None:
        return dh, dY, walk(chunks, dht, V, True, want_dh0, dh0)
    assert select is None, "a pass over segments runs every sequence"
    maps = None if transitions is None else transitions.M.transpose(-1, -2)
    dh0, _ = run(walk, segments, dht, H, K, V, maps=maps, reverse=True)
    return dh, dY, dh0 if want_dh0 else None


def dstate_outputs(keys: PreparedKeys, do, chunks: Chunks, scaled: bool, want_dh0: bool,
                   segments: Segments | None = None, config: dict | None = None):
    """``dstate``'s outputs ``(dh, dY, dh0 or None)``, allocated (its launch's value blocks set the row scales'), for
    passes over parts of the sequences that write into the same ones."""
    total, H, V = do.shape
    K = keys.kg.shape[-1]
    config = {n: x for n, x in (config or {}).items() if n != "KB"}
    block = dstate_launch(chunks if segments is None else segments.chunks, H, K, V, config)["BV"]
    return (allocate((chunks.num_chunks, H, K, V), block, scaled, torch.float32, do.device),
            allocate((total, H, V), block, scaled, torch.float32, do.device),
            torch.empty(chunks.num_seqs, H, K, V, device=do.device, dtype=torch.float32) if want_dh0 else None)


def grads(q, k, v, g, G, beta, hs: Stored, dh: Stored, U: Stored, dY: Stored, do, A_log, dt_bias, lower_bound,
          chunks: Chunks, scale: float, flags: torch.Tensor | None, use_gather: bool, precision: str, dq_dtype,
          dk_dtype, config: dict | None = None,
          parts: Sequence[tuple[Selection | None, Callable[[], None] | None]] = ((None, None),)):
    """Per-chunk gradients: ``(dq, dk, dv, dg, dbeta, dA_log or None, ddt_bias or None)``. hs and U as the
    forward pass stored them, dh and dY as the reverse pass did (each pair scaled alike or not); ``flags`` the
    forward's (``chunk_fwd.intra``: the chunks whose diagonal blocks are summed exactly), None under safe_gate.

    dq/dk in the given dtypes, dv/dg/dbeta in v's/g's/beta's dtype; ``A_log`` given means g is the
    raw gate input (use_gate_in_kernel) and dg is chained through the gate. ``config`` overrides the
    launches (``BK``, ``BV``, ``num_warps`` of the key side; ``value``: ``BV``, ``num_warps`` of the
    value side; ``pairs``: ``grads_pairs_kernel``'s, ``diag``: ``grads_diag_kernel``'s). ``parts``: the launches over
    the chunks of each ``(selection, ready)`` in turn (None: all), ``ready()`` first where given (the backward by
    sequence groups: a group's launches once its passes are done, ``api``). G ``[T, H]`` (one decay per head: Gated
    DeltaNet): the pair sums by ``scalar_pairs_kernel`` (``config["scalar"]``), dg ``[T, H]`` fp32 with respect to
    the log-decay, q and k with fewer heads than v and beta, H a multiple of theirs (``tiles.key_head``; dq and dk
    per value head)."""
    total, H = beta.shape
    K = k.shape[-1]
    V = v.shape[-1]
    scalar = G.dim() == 2
    group = H // k.shape[1]
    assert scalar or group == 1, "grouped value heads with a [T, H] gate only"
    NC = chunks.num_chunks
    C = chunks.size
    dev = k.device
    f32 = torch.float32
    use_gate = A_log is not None
    config = dict(config or {})
    scaled = hs.scaled
    assert all(x.scaled == scaled for x in (dh, U, dY)), "h, dh, U and dY are row-scaled all or none"
    # grads_state's value blocks lie within the writers' (``scaled.scaled_back``: one scale a row); grads_v's may span several
    # (``scaled.load_tile_scaled_blocks``): at 64 where the reverse pass writes blocks of 32 (``dstate_launch``), H100,
    # B=8, 0.591 ms at 32 in the benchmark's kernel times at 715fa8d, 0.065 less at 64
    widest = min(64, hs.block, dh.block) if scaled else 64
    vcfg = dict(BV=min(padded(V), 64), num_warps=4, num_stages=1) | config.pop("value", {})
    dcfg = DIAG_LAUNCH | config.pop("diag", {})
    pcfg = PAIRS_LAUNCH | config.pop("pairs", {})
    scfg = SCALAR_PAIRS_LAUNCH | config.pop("scalar", {})
    # grads_state's loop over the value blocks in blocks of 32, three load stages (measured when the pair sums' row
    # and column kernels took this launch too; ``grads_pairs_kernel`` has its own, ``PAIRS_LAUNCH``): on an H100 (bf16,
    # B=8, T=4096, H=16, K=V=128, ``benchmarks/kda.py --profile``, two runs, at 96ae723)
    # the four gradient kernels took 5.41 ms against 5.59 with blocks of 64 at two stages (safe_gate 5.37 vs 5.52); 5.74
    # at one stage, 6.05 at four, 5.72 with blocks of 16
    kcfg = dict(BK=min(padded(K), 32), BV=min(padded(V), widest, 32), num_warps=4, num_stages=3) | config
    if scaled and kcfg["BV"] > widest:
        raise ValueError(f"config: value blocks of at most {widest} columns (the row-scaled arrays' blocks)")
    nkb = triton.cdiv(K, kcfg["BK"])
    pcfg["BK"] = kcfg["BK"]   # dbeta's shares are by grads_state's channel blocks
    dq = torch.empty(total, H, K, device=dev, dtype=dq_dtype)
    dk = torch.empty(total, H, K, device=dev, dtype=dk_dtype)
    dv = torch.empty_like(v)
    dg = torch.empty(total, H, device=dev, dtype=f32) if scalar else torch.empty_like(g)
    dL = torch.empty(total, H, C, device=dev, dtype=f32)
    dP = torch.empty_like(dL)
    dbeta = torch.empty(1 + nkb, total, H, device=dev, dtype=f32)
    dq_part, dk_part, dG_part = (torch.empty(total, H, K, device=dev, dtype=f32) for _ in range(3))
    da = torch.zeros(NC, H, nkb, device=dev, dtype=f32) if use_gate else None
    ddt = torch.zeros(NC, H, K, device=dev, dtype=f32) if use_gate else None
    safe = flags is None
    flag_ptr = dL if safe else flags  # read where not safe only
    paths = dict(C=C, BC=SUB, SAFE=safe, USE_GATHER=use_gather, PREC=precision,
                 DPREC=diag_precision(precision, q.dtype))

    def state_blocks_of(step):  # grads_state's operands by its step's blocks (``common.tma_operands``)
        BK, BV = step["BK"], step["BV"]
        return (*((x.data.view(-1, K, V), [1, BK, BV]) for x in (hs, dh)),
                *((x, [C, 1, BV]) for x in (U.data, dY.data, do)))
    tma = use_tma(kcfg, *(x for x, _ in state_blocks_of(kcfg)))  # the same for every step of the ladder
    ladder = [step | dict(TMA=tma) for step in (kcfg, kcfg | dict(num_stages=1), kcfg | dict(BV=16, num_stages=1),
                                                 kcfg | dict(BV=16, num_warps=8, num_stages=1))]

    def launch_part(select: Selection | None):  # every launch over the chunks of a selection (None: all)
        NCs = NC if select is None else select.num_chunks
        if not (NCs and H):
            return
        chunk_args = (chunks.cu, chunks.seq, chunks.start, chunks.seq if select is None else select.chunks)
        part = dict(SELECT=select is not None)
        launch(grads_v_kernel, (NCs, H),
               (v, beta, U.data, U.scale_ptr(), dY.data, dY.scale_ptr(), do, dv, dL, dP, dbeta, *chunk_args, H, V,
                U.blocks, dY.blocks),
               dict(C=C, U_SB=U.block, DY_SB=dY.block, SCALED=scaled, PREC=precision) | part, [vcfg, vcfg | dict(BV=16)])

        def state_args(step):
            hsd, dhd, Ud, dYd, dOd = tma_operands(step, *state_blocks_of(step))[1]
            return (q, k, G, beta, hsd, hs.scale_ptr(), dhd, dh.scale_ptr(), Ud, U.scale_ptr(), dYd, dY.scale_ptr(),
                    dOd, dq_part, dk_part, dG_part, dbeta, *chunk_args, scale, H, K, V, total, hs.block, hs.blocks,
                    dh.block, dh.blocks)
        launch(grads_state_kernel, (NCs * nkb, H), state_args,
               dict(C=C, SCALED=scaled, PREC=precision, SCALAR=scalar, GROUP=group) | part, ladder)
        if scalar:
            launch(scalar_pairs_kernel, (NCs, H),
                   (q, k, G, beta, dL, dP, dq_part, dk_part, dG_part, dq, dk, dg, dbeta, *chunk_args, scale,
                    H, K, total), dict(C=C, PREC=precision, GROUP=group) | part,
                   [scfg | dict(BK=min(scfg["BK"], padded(K)))])
            return
        if not safe:
            launch(grads_diag_kernel, (NCs, H),
                   (q, k, G, beta, dL, dP, flags, dq_part, dk_part, dG_part, dbeta, *chunk_args, scale, H, K, total),
                   dict(C=C, BC=SUB, BK=kcfg["BK"]) | part, [dcfg])
        launch(grads_pairs_kernel, (NCs * nkb, H),
               (q, k, g, G, beta, dL, dP, flag_ptr, A_log if use_gate else g, dt_bias if dt_bias is not None else g,
                dq_part, dk_part, dG_part, dq, dk, dg, dbeta, da if use_gate else g, ddt if use_gate else g,
                *chunk_args, scale, float(lower_bound or 0.0), H, K, total),
               paths | part | dict(USE_GATE=use_gate, HAS_BIAS=use_gate and dt_bias is not None,
                                   USE_LB=lower_bound is not None), [pcfg])

    for select, ready in parts:
        if ready is not None:
            ready()
        launch_part(select)
    dbeta = dbeta.sum(0).to(beta.dtype)
    if not use_gate:
        return dq, dk, dv, dg, dbeta, None, None
    assert da is not None and ddt is not None   # allocated when use_gate
    return dq, dk, dv, dg, dbeta, da.sum((0, 2)), (ddt.sum(0).reshape(H * K) if dt_bias is not None else None)
