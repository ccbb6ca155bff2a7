"""Chunked KDA forward: the intra-chunk WY factors, then the state recurrence with the output.

Per head, a chunk of C rows (tokens) starts from state ``S0 [K, V]``. With ``G`` the chunk-local
cumulative log-decay ``[C, K]``, ``Kg = k e^G``, ``Qg = scale q e^G``, ``Kd = k e^{G_last - G}``,
``gamma = e^{G_last}``:

    A_ij = sum_d k_id k_jd e^{G_id - G_jd}  (j < i),    L = Diag(beta) A,    T = (I + L)^{-1}
    P_ij = scale sum_d q_id k_jd e^{G_id - G_jd}  (j <= i)
    U  = T Diag(beta) (V - Kg S0)        (the values the delta rule writes, ``[C, V]``)
    O  = Qg S0 + P U
    S1 = Diag(gamma) S0 + Kd^T U

``intra`` computes T and P for every chunk in parallel (``[T, H, C]``, row t of a chunk holds its row of the
chunk matrix; T row-scaled fp16 under "tf32", P fp32 or fp16, ``p_dtype``), by sub-chunk blocks (``blocks``): the
diagonal blocks a sub-chunk a program, the blocks below them and the solve a chunk a program (``intra``);
``recurrence`` walks the chunks of each sequence in order, one program per (value block, sequence, head),
keeping S in registers, and forms each chunk's U and, in the forward, its O (where U is: h and U are not stored;
the backward recomputes them with the same kernel, which then stores them). A long single sequence has few
programs: its passes run over segments side by side (``chunk.segments``).

Measured and not kept (H200, bf16, B=8, T=4096, H=16, K=V=128): forming ``W = T Diag(beta) Kg`` and
``U0 = T Diag(beta) V`` in parallel so that the serial step is ``U = U0 - W S0``, two dots where it has
three. The serial pass gains 0.19 ms (0.93 -> 0.74; 4.05 -> 3.22 at B=1, T=32768), but the products cost
0.72 ms in their own kernel (two fp32 ``[T, H, 128]`` arrays written, four block rows read per block row)
and 0.76 fused into ``intra``: a net loss of 0.57 ms at B=8, and a gain of 0.08 ms at B=1, too small for a
second path. W alone, prepared in place of ``k e^G`` (no more storage; the step ``U = T Diag(beta) V - W S``,
two dependent dots): the pass with its operands 0.903 -> 1.096 ms at B=8 (measured on an H100 at
71b3991).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..chunk.prepared import PreparedKeys
from ..chunk.scaled import Stored, allocate, load_rows_scaled, row_scaled, store_tile_scaled
from ..chunk.segments import Segments, Transitions, run
from ..chunk.state import (
    block_gammas,
    block_scales,
    half_state,
    launch_serial,
    load_blocks,
    read_blocks,
    read_half_state,
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
    load_rows,
    load_rows_stored,
    load_rowvec,
    store_tile,
    tf32_nearest,
)
from ..common import Chunks, Selection, launch, launch_only, padded, tma_operands
from .blocks import (
    NB,
    below_blocks,
    below_inverse,
    below_scalar,
    block_beta,
    diag_block,
    load_block,
    store_below,
    store_block,
    store_diag_inverse,
    store_t_rows,
    store_zeros_right,
)
from .subchunk import diag_precision

CHUNK = 64
SUB = 16
DIAG_LAUNCH = dict(BK=32, num_warps=1)
"""``diag_kernel``'s launch (``[16, BK]`` tiles). Measured on an H200 (bf16, B=8, T=4096, H=16, K=128, the three
launches of ``intra``, at a17baeb): 0.611 ms at 1 warp (161 registers), 0.795 at 2 warps; channel blocks of 16
0.646, 64 0.732 (255 registers, 24 B spilled), 128 1.303. At most 128 registers 0.603 against 0.605 (at 5ed3962)."""
BELOW_LAUNCH = dict(BK=16, num_warps=1, num_stages=2)
"""``below_kernel``'s launch (``[16, BK]`` tiles, twelve ``[16, 16]`` sums) where its sums are "tf32" dots: ``intra``
0.575 ms at channel blocks of 16 (8 B spilled), 0.611 at 32 (224 B), 0.980 at 64; 0.667 at 2 warps (BK 32, the first
profile's 0.938 at 2 warps for both kernels, at 04b1a87); one load stage 0.800, three 0.609 (H200, at a17baeb).
Its registers capped (255 now; ``maxnreg``): 192 0.616 against 0.605, 168 0.645, 128 0.936 (at 5ed3962)."""
BELOW_HALF_LAUNCH = BELOW_LAUNCH | dict(BK=32)
"""``below_kernel``'s launch where its sums are fp16 dots (``half_pairs``; their operands take half the registers):
measured on an H200 (bf16, B=8, T=4096, H=16, K=128, ``intra`` with the diagonal blocks at "tf32",
``benchmarks/results/kda_profile_intra_h200.txt``, at c584f12) 0.489 ms at channel blocks of 32, 0.529 at 16, 0.732 at 64; 0.613
at 2 warps, one load stage 0.736, three 0.533; at most 192 registers 0.535, 168 0.553, 128 0.736."""
INVERSE_LAUNCH = dict(num_warps=1)
"""``exact_inverse_kernel``'s launch (``[16, 16]`` dots): 72 registers at 1 warp; the only one timed (its kernel's
docstring)."""
PREPARED_LAUNCH = dict(num_stages=2)
"""The serial passes' loads feed their dots directly (``chunk.prepared``), so they take two load stages at
every value block: measured on an H200 (bf16, H=16, K=V=128, fp16 operands), B=8, T=4096, value blocks of
64, 0.558 -> 0.479 ms."""


def state_width(scaled: bool) -> int:
    """The rows of the serial pass's state blocks (``KB``, at most the prepared operands' scale block,
    ``chunk.prepared.SCALE_BLOCK``): 64 for the forward's pass (its output in it, its states not stored, or stored fp32
    under ``disable_recompute``), 128 for the backward's recomputation (states row-scaled, ``chunk.scaled``). Measured
    on an H200 (bf16, H=16, K=V=128, the pass with its operands' preparation, before its output moved into it,
    at 56d920f), blocks of 64 against 128: the forward's B=8, T=4096 0.575 /
    0.623 ms, B=1, T=32768 over segments 1.151 / 1.229, varlen 0.866 / 0.937; the recomputation 0.620 / 0.598, 0.608 /
    0.596, 0.959 / 0.907."""
    return 128 if scaled else 64


def exact_launch(K: int) -> dict:
    """``exact_kernel``'s launch: a sub-chunk of BH heads a program (``[BH, K]`` rows), one warp for every 256 channels
    and as many heads as fill its lanes with 8 channels each (two at K = 128). Measured on an H200 (bf16, B=8, T=4096,
    H=16, K=128, ``intra`` under strong decay, at 568d68b): 0.796 ms; one
    head 0.882, two heads at 2 warps 0.922, 4 heads at 1 warp 0.841, at 2 warps 0.820, 8 heads at 4 warps 0.926; at most
    128 registers (149 without) 0.801. Before the heads were the tiles' rows (one head a program, the walk's
    ``[16, K]`` tile splitting its rows over two warps, each row's k, q and G converted into its layout through shared
    memory): about 1.10."""
    return dict(BH=max(1, 256 // padded(K)), num_warps=max(1, padded(K) // 256))


@triton.jit
def head_row(ptr, t, end, H, K, heads, d, mask):
    """Token t's row ``[1, BH, BK]`` of a ``[T, H, K]`` tensor for the program's heads (zeros from token ``end`` on),
    as stored: loaded with the column dimension in front, so that it broadcasts over the columns ``[W, BH, BK]`` of
    ``diag_walk`` in the layout it is loaded in."""
    off = ((t.to(tl.int64) * H + heads)[:, None] * K + d[None, :])[None, :, :]
    return tl.load(ptr + off, mask=mask & (t < end), other=0.0)


@triton.jit
def head_rows(q_ptr, k_ptr, G_ptr, t, end, H, K, heads, d, mask):
    """Token t's k, q (fp32) and G of the program's heads (``head_row``)."""
    return (head_row(k_ptr, t, end, H, K, heads, d, mask).to(tl.float32),
            head_row(q_ptr, t, end, H, K, heads, d, mask).to(tl.float32), head_row(G_ptr, t, end, H, K, heads, d, mask))


@triton.jit
def diag_walk(X, q_ptr, k_ptr, G_ptr, D_ptr, P_ptr, scale, t, first, last, end, H, K, heads, d, m, b0, c0, mine,
              C: tl.constexpr, ZERO_RIGHT: tl.constexpr):
    """Rows ``first .. last - 1`` (tokens ``t + i``) of the diagonal block at chunk column b0 against its W columns
    ``c0 + j`` (both counted from the block's first row and column), exactly for any decay, one row after another: A's
    into the diagonal blocks' array (``[T, H, 2W]``), P's (scaled) into P's, for the heads where ``mine`` ``[BH]``
    (with ``ZERO_RIGHT`` zeros into P's next W columns). ``X [W, BH, BK]``: the columns' decayed keys of row ``first``,
    ``X_j = k_j e^{G_i - G_j}`` (zero for j > i), carried from row to row, ``X <- X e^{G_{i+1} - G_i}`` and row i + 1's
    own key in its column: one row of exponentials a step, every factor in (0, 1], so that a product only underflows
    where ``e^{G_i - G_j}`` does; a product carries at most 15 roundings. Returns X of row ``last``."""
    W: tl.constexpr = X.shape[0]
    cols = tl.arange(0, W)
    j = cols[:, None, None]
    k_i, q_i, G_i = head_rows(q_ptr, k_ptr, G_ptr, t + first, end, H, K, heads, d, m)
    for i in range(first, last):
        # the next row's loads issued before this row's sums, so that their latency is not a step of the walk
        k_n, q_n, G_n = head_rows(q_ptr, k_ptr, G_ptr, t + i + 1, end, H, K, heads, d, m)
        row = ((t + i).to(tl.int64) * H + heads)[None, :]
        out = row * C + b0 + c0 + cols[:, None]
        tl.store(D_ptr + row * (2 * W) + c0 + cols[:, None], tl.sum(k_i * X, axis=2), mask=mine[None, :])
        tl.store(P_ptr + out, (scale * tl.sum(q_i * X, axis=2)).to(P_ptr.dtype.element_ty), mask=mine[None, :])
        if ZERO_RIGHT:
            tl.store(P_ptr + out + W, tl.zeros((W, heads.shape[0]), P_ptr.dtype.element_ty), mask=mine[None, :])
        X = tl.where(j + c0 == i + 1, k_n, X * decay(G_n - G_i))  # the columns j > i + 1 stay zero
        k_i, q_i, G_i = k_n, q_n, G_n
    return X


@triton.jit
def diag_key(k_ptr, t, i, end, H, K, heads, d, m, W: tl.constexpr):
    """The decayed keys that start a walk of W columns at row i, the first of them: ``k_i`` in the first column, zeros
    in the others ``[W, BH, BK]``."""
    k = head_row(k_ptr, t + i, end, H, K, heads, d, m).to(tl.float32)
    return k * (tl.arange(0, W) == 0).to(tl.float32)[:, None, None]


@triton.jit
def diag_kernel(q_ptr, k_ptr, G_ptr, beta_ptr, D_ptr, P_ptr, flag_ptr, cu_ptr, seq_ptr, start_ptr, scale, H, K,
                C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, SAFE: tl.constexpr, DPREC: tl.constexpr,
                SCALAR: tl.constexpr, GROUP: tl.constexpr):
    """One sub-chunk s and head: the diagonal blocks of P (scaled, zeros right of them) and of ``T = (I + Diag(beta)
    A)^{-1}`` (into the diagonal blocks' array ``[T, H, BC]``) by dots against the middle row (``blocks.diag_block``).
    Without ``SAFE``, a sub-chunk the front flagged (bit s of ``flag[c, h]``, ``blocks.span_flags``: its decay exceeds
    ``DIAG_SPAN``) forms no dots: ``exact_kernel`` sums it (the backward sums the flagged chunks' diagonal blocks
    exactly too). Finding the span here (the first channels' before any dot, the rest beside the dots), this kernel took
    0.272 ms at normal decay against 0.233 reading the front's flags (H200, B=8, T=4096, H=16, K=128, at 774d826).
    ``SCALAR``: a ``[T, H]`` gate, whose blocks the dots give for any decay (``blocks.diag_block``; launched ``SAFE``), and
    q and k with ``H / GROUP`` heads (``tiles.key_head``: grouped value heads)."""
    c = tl.program_id(0) // NB
    s = tl.program_id(0) % NB
    h = tl.program_id(1)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    if s * BC < n:
        dots = True
        if not SAFE:
            dots = ((tl.load(flag_ptr + c.to(tl.int64) * H + h) >> s) & 1) == 0
        if dots:
            hk, HK = key_head(h, H, GROUP)
            A, P = diag_block(q_ptr, k_ptr, G_ptr, t0, n, s, h, H, K, BC, BK, DPREC, SCALAR, hk, HK)
            store_block(P_ptr, scale * P, t0, n, s, s, h, H, C, BC)
            store_diag_inverse(D_ptr, beta_ptr, A, t0, n, s, h, H, BC, DPREC)
        store_zeros_right(P_ptr, t0, n, s, h, H, C, BC)


@triton.jit
def exact_kernel(q_ptr, k_ptr, G_ptr, D_ptr, P_ptr, flag_ptr, cu_ptr, seq_ptr, start_ptr, scale, H, K, C: tl.constexpr,
                 BC: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr):
    """One sub-chunk s of BH heads (those ``diag_kernel`` did not flag return at once): the diagonal blocks of the
    flagged heads, exactly for any decay (``diag_walk``, K in one tile of BK), A's left in the diagonal blocks' array
    for ``exact_inverse_kernel``. The first half of a block's rows takes its first half of columns only (of the 16 x 16
    pairs three walks of 8 columns form 192). The heads are the rows of every tile (``[BH, BK]``, the columns ``[W, BH,
    BK]``), so that a row's k, q and G broadcast over the columns in the layout they are loaded in."""
    W: tl.constexpr = BC // 2
    c = tl.program_id(0) // NB
    s = tl.program_id(0) % NB
    h0 = tl.program_id(1) * BH
    flags = flag_ptr + c.to(tl.int64) * H
    # the heads' flags OR-ed as scalars: a program with nothing flagged returns before any tile is formed
    word = tl.load(flags + h0)
    for hh in tl.static_range(1, BH):
        word |= tl.load(flags + h0 + hh, mask=h0 + hh < H, other=0)
    if (word >> s) & 1:
        t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
        heads = h0 + tl.arange(0, BH)
        mine = ((tl.load(flags + heads, mask=heads < H, other=0) >> s) & 1) != 0
        d = tl.arange(0, BK)
        m = ((heads < H)[:, None] & (d < K)[None, :])[None, :, :]
        t = t0 + s * BC
        end = t0 + tl.minimum(n, (s + 1) * BC)
        # three walks of W columns: the first half of the rows against the first half of the columns (P's second
        # half zero), the second half of the rows against it (its columns carried on), then against the second half
        lo = diag_walk(diag_key(k_ptr, t, 0, end, H, K, heads, d, m, W), q_ptr, k_ptr, G_ptr, D_ptr, P_ptr, scale, t, 0,
                       tl.minimum(W, end - t), end, H, K, heads, d, m, s * BC, 0, mine, C, True)
        diag_walk(lo, q_ptr, k_ptr, G_ptr, D_ptr, P_ptr, scale, t, W, end - t, end, H, K, heads, d, m, s * BC, 0, mine, C,
                  False)
        diag_walk(diag_key(k_ptr, t, W, end, H, K, heads, d, m, W), q_ptr, k_ptr, G_ptr, D_ptr, P_ptr, scale, t, W,
                  end - t, end, H, K, heads, d, m, s * BC, W, mine, C, False)


@triton.jit
def exact_inverse_kernel(beta_ptr, D_ptr, flag_ptr, cu_ptr, seq_ptr, start_ptr, H, C: tl.constexpr, BC: tl.constexpr,
                         DPREC: tl.constexpr):
    """One chunk and head, after ``exact_kernel`` (those with no sub-chunk flagged return at once): the inverse of each
    flagged diagonal block, ``T_ss = (I + Diag(beta) A_ss)^{-1}`` from the ``A_ss`` that ``exact_kernel`` left in the
    diagonal blocks' array, in place. In ``exact_kernel``'s programs (149 registers, 13 of them an SM) the inverses took
    0.13 ms of its 0.44; here 0.07 (H200, B=8, T=4096, H=16, K=128, strong decay); a program per sub-chunk took 0.06 but
    0.021 at normal decay, where its 32768 programs return at once (8192 here: 0.006)."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    word = tl.load(flag_ptr + c.to(tl.int64) * H + h)
    if word != 0:
        t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
        for s in tl.static_range(NB):
            if (word >> s) & 1:
                store_diag_inverse(D_ptr, beta_ptr, load_block(D_ptr, t0, n, s, 0, h, H, BC, BC), t0, n, s, h, H, BC,
                                   DPREC)


@triton.jit
def below_kernel(q_ptr, k_ptr, G_ptr, beta_ptr, D_ptr, P_ptr, T_ptr, t_s_ptr, cu_ptr, seq_ptr, start_ptr, scale, H,
                 K, C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, T_SCALED: tl.constexpr,
                 HALF: tl.constexpr, SCALAR: tl.constexpr, GROUP: tl.constexpr):
    """One chunk and head, after ``diag_kernel``: the blocks below the diagonal of P (scaled), and T whole, its
    blocks below the diagonal by block forward substitution from its diagonal blocks in memory (``blocks``; the
    diagonal blocks' array ``[T, H, BC]``), with ``T_SCALED`` row-scaled (``blocks.store_t_rows``); with ``HALF`` the
    blocks' sums by fp16 dots (``blocks.below_blocks``); ``SCALAR``: a ``[T, H]`` gate (``blocks.below_scalar``), q and
    k with ``H / GROUP`` heads (``tiles.key_head``)."""
    tl.static_assert(C == NB * BC, "a chunk is four sub-chunks")
    c = tl.program_id(0)
    h = tl.program_id(1)
    t0, n = chunk_span(c, cu_ptr, seq_ptr, start_ptr, C)
    if SCALAR:
        hk, HK = key_head(h, H, GROUP)
        A10, A20, A21, A30, A31, A32, P10, P20, P21, P30, P31, P32 = below_scalar(q_ptr, k_ptr, G_ptr, t0, n, h, H, hk,
                                                                                  HK, K, BC, BK, PREC, HALF)
    else:
        A10, A20, A21, A30, A31, A32, P10, P20, P21, P30, P31, P32 = below_blocks(q_ptr, k_ptr, G_ptr, t0, n, h, H, K,
                                                                                  BC, BK, PREC, HALF)
    store_below(P_ptr, scale * P10, scale * P20, scale * P21, scale * P30, scale * P31, scale * P32, t0, n, h, H, C, BC)
    b1 = block_beta(beta_ptr, t0, n, 1, h, H, BC)
    b2 = block_beta(beta_ptr, t0, n, 2, h, H, BC)
    b3 = block_beta(beta_ptr, t0, n, 3, h, H, BC)
    T00 = load_block(D_ptr, t0, n, 0, 0, h, H, BC, BC)
    T11 = load_block(D_ptr, t0, n, 1, 0, h, H, BC, BC)
    T22 = load_block(D_ptr, t0, n, 2, 0, h, H, BC, BC)
    T33 = load_block(D_ptr, t0, n, 3, 0, h, H, BC, BC)
    T10, T20, T21, T30, T31, T32 = below_inverse(T00, T11, T22, T33, b1 * A10, b2 * A20, b2 * A21, b3 * A30, b3 * A31,
                                                 b3 * A32, PREC)
    zero = tl.zeros((BC, BC), tl.float32)
    store_t_rows(T_ptr, t_s_ptr, T00, zero, zero, zero, t0, n, 0, h, H, C, BC, T_SCALED)
    store_t_rows(T_ptr, t_s_ptr, T10, T11, zero, zero, t0, n, 1, h, H, C, BC, T_SCALED)
    store_t_rows(T_ptr, t_s_ptr, T20, T21, T22, zero, t0, n, 2, h, H, C, BC, T_SCALED)
    store_t_rows(T_ptr, t_s_ptr, T30, T31, T32, T33, t0, n, 3, h, H, C, BC, T_SCALED)


@triton.jit
def recurrence_kernel(kg, sg_ptr, kd, sd_ptr, v, G_ptr, beta_ptr, T, t_s_ptr, h0_ptr, ht_ptr, hs, hs_s_ptr, u_ptr,
                      u_s_ptr, qg, sq_ptr, P, o_ptr, cu_ptr, off_ptr, sel_ptr, scale, H, K, V, W, C: tl.constexpr,
                      KB: tl.constexpr, NKB: tl.constexpr, SB: tl.constexpr, NSB: tl.constexpr, BV: tl.constexpr,
                      HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr, STEPS: tl.constexpr, SCALED: tl.constexpr,
                      T_SCALED: tl.constexpr, OUTPUT: tl.constexpr, HALF: tl.constexpr, PREC: tl.constexpr,
                      TMA: tl.constexpr, SELECT: tl.constexpr, SCALAR: tl.constexpr, GROUP: tl.constexpr,
                      SCALES_IN_DOT: tl.constexpr):
    """One value block, sequence and head: walk the chunks, the state in NKB blocks S0..S3 [KB, BV];
    with ``STEPS``, ``hs[c] = S0`` and U of every chunk, fp32 or with ``SCALED`` row-scaled (``chunk.scaled``, scales
    at ``hs_s_ptr``, ``u_s_ptr``); with ``OUTPUT`` each chunk's output ``O = scale Qg S0 + P U`` into o (P fp32 or
    fp16, ``p_dtype``).
    ``Kg``, ``Kd`` and ``Qg = q e^G`` prepared (``chunk.prepared``, Qg's scales at ``sq_ptr``); with ``HALF`` (fp16
    operands) the dots of Kg and Qg take the state in fp16 over a power of two (``state.half_state``,
    ``state.read_half_state``); T with ``T_SCALED`` row-scaled (scales at ``t_s_ptr``, ``intra``).
    ``kg``, ``kd``, ``v``, ``T``, ``qg``, ``P`` and ``hs`` are pointers, or with ``TMA`` descriptors
    (``tiles.load_rows``, ``state.store_state``): the loaded rows past a sequence's end enter Z, U and O, but beta's
    zeros drop them from ``Diag(beta) Z``, Kd's zero row scales from the update, P's zeros above the diagonal from
    the valid rows of O, and no store writes them. The state has W >= V columns (h0 and ht ``[N, H, K, W]``), the
    values V: the columns past V start from h0 and take zero values (``chunk.segments``' transitions). The operands'
    row scales are by ``SB``-wide column blocks (``NSB`` of them, ``state.block_scales``).
    A step loads its values first and forms ``Z = V - Kg S`` after the dot: loaded where the dot took them as its
    accumulator, the wait for their TMA load held 21% of the pass's stall samples (ncu, H200, B=8, at
    56d920f). With ``SELECT`` the sequences listed at sel_ptr only; ``SCALAR``: G a ``[T, H]`` gate (``tiles.load_gate``);
    the prepared operands with ``H / GROUP`` heads, their row scales with H (``tiles.key_head``: grouped value heads,
    whose operands differ by their row scales alone). ``SCALES_IN_DOT``: the dots take the prepared operands with their
    row scales applied (exact for KDA's powers of two, ``chunk.prepared``), else the scales apply to their products
    (Gated DeltaNet's operands: q and k as the front leaves them, 16-bit values that a "tf32" dot takes exactly, under
    fp32 scales ``e^G``)."""
    nh, h, bos, eos, c_first, vv, vmask = serial_program(cu_ptr, off_ptr, H, V, BV, sel_ptr, SELECT)
    hk, HK = key_head(h, H, GROUP)
    wmask = vv < W
    S0, S1, S2, S3 = load_blocks(h0_ptr, nh, K, W, KB, NKB, BV, vv, wmask, HAS_H0)
    for it in range(tl.cdiv(eos - bos, C)):
        t0, rows, rmask, grows, last = serial_chunk(bos, eos, it, C)
        values = load_rows(v, t0, rows, rmask, h, H, V, tl.program_id(0) * BV, BV, TMA)
        sg0, sg1, sg2, sg3 = block_scales(sg_ptr, rows, rmask, h, H, NSB, KB, SB, NKB)
        sd0, sd1, sd2, sd3 = block_scales(sd_ptr, rows, rmask, h, H, NSB, KB, SB, NKB)
        if OUTPUT:
            sq0, sq1, sq2, sq3 = block_scales(sq_ptr, rows, rmask, h, H, NSB, KB, SB, NKB)
            sq0, sq1, sq2, sq3 = scale * sq0, scale * sq1, scale * sq2, scale * sq3
        g0, g1, g2, g3 = block_gammas(G_ptr, last, h, H, K, KB, NKB, SCALAR)
        beta = load_rowvec(beta_ptr, rows, rmask, h, H)
        if STEPS:
            store_blocks(hs, S0, S1, S2, S3, (c_first + it) * H + h, K, V, KB, NKB, vv, vmask, 0, hs_s_ptr, SCALED,
                         TMA)
        zero = tl.zeros((C, BV), tl.float32)
        if HALF:
            Sh0, Sh1, Sh2, Sh3, p = half_state(S0, S1, S2, S3, NKB)
            Z = read_half_state(values, Sh0, Sh1, Sh2, Sh3, p, kg, -sg0, -sg1, -sg2, -sg3, t0, rows, rmask, hk, HK, K, KB,
                                NKB, SB, TMA)
            if OUTPUT:
                O = read_half_state(zero, Sh0, Sh1, Sh2, Sh3, p, qg, sq0, sq1, sq2, sq3, t0, rows, rmask, hk, HK, K, KB,
                                    NKB, SB, TMA)
        else:
            Z = values - read_blocks(S0, S1, S2, S3, zero, kg, sg0, sg1, sg2, sg3, t0, rows, rmask, hk, HK, K, KB, NKB,
                                     FIRST=SCALES_IN_DOT, PREC=PREC, TMA=TMA)
            if OUTPUT:
                O = read_blocks(S0, S1, S2, S3, zero, qg, sq0, sq1, sq2, sq3, t0, rows, rmask, hk, HK, K, KB, NKB,
                                FIRST=SCALES_IN_DOT, PREC=PREC, TMA=TMA)
        Tc = load_rows_scaled(T, t_s_ptr, t0, rows, rmask, h, H, C, 0, C, C, 1, T_SCALED, TMA)
        # rounded to nearest for the dots that take it (the update's, the output's), which would truncate it
        U = tf32_nearest(tl.dot(Tc, beta[:, None] * Z, input_precision=PREC), PREC)
        if STEPS:
            store_tile_scaled(u_ptr, u_s_ptr, U, rows, rmask, h, H, V, vv, vmask, SCALED)
        if OUTPUT:
            Pc = load_rows_stored(P, t0, rows, rmask, h, H, C, 0, C, TMA)
            if Pc.dtype != tl.float16:  # fp16 (``p_dtype``) holds 11 significant bits, as the dot takes them
                Pc = tf32_nearest(Pc.to(tl.float32), PREC)
            O = tl.dot(Pc.to(tl.float32), U, O, input_precision=PREC)
            store_tile(o_ptr, O, rows, rmask, h, H, V, vv, vmask)
        S0, S1, S2, S3 = update_blocks(S0, S1, S2, S3, U, kd, sd0, sd1, sd2, sd3, g0, g1, g2, g3, t0, rows, rmask, hk,
                                       HK, K, KB, NKB, DECAY=True, FIRST=SCALES_IN_DOT, PREC=PREC, TMA=TMA)
    if STORE_FINAL:
        store_blocks(ht_ptr, S0, S1, S2, S3, nh, K, W, KB, NKB, vv, wmask)


def half_pairs(unit_rows: bool, precision: str) -> bool:
    """Whether ``below_kernel`` sums the blocks below the diagonal by fp16 dots (``blocks.below_blocks``): under
    "tf32", where q's and k's rows are of unit length (``use_qk_l2norm``), so that every operand lies in [-1, 1]."""
    return unit_rows and precision == "tf32"


def p_dtype(half: bool, scale: float) -> torch.dtype:
    """P's dtype: fp16 where its sums are fp16 dots (``half_pairs``: ``|P_ij| <= |scale|``) and the scale lies in
    ``[2^-8, 2^8]``, so that P fits fp16 and its subnormals (an absolute 2^-25) stay below a "tf32" rounding of the
    largest entries (a relative 2^-11 of ``|scale|``); else fp32. The serial passes read P as a "tf32" dot's operand,
    rounded to 11 significant bits, fp16's."""
    return torch.float16 if half and 2.0 ** -8 <= abs(scale) <= 2.0 ** 8 else torch.float32


def intra(q, k, G, beta, chunks: Chunks, scale: float, flags: torch.Tensor | None, precision: str,
          unit_rows: bool = False, config: dict | None = None):
    """``(T, P)``: the inverse factor and the scaled Aqk of every chunk, ``[T, H, C]`` each: T a ``scaled.Stored``,
    fp32 or under "tf32" row-scaled fp16 (the serial passes read it as a "tf32" dot's operand, ``chunk.scaled``), P
    in ``p_dtype`` (fp16 with ``unit_rows``, q's and k's rows of unit length, under "tf32": ``half_pairs``).
    ``flags``: without safe_gate the sub-chunks the front flagged (int32 ``[NC, H]``, bit s for sub-chunk s,
    ``front.front``, ``blocks.span_flags``), whose diagonal blocks are summed exactly (the backward sums a flagged
    chunk's alike, ``chunk_bwd.grads``); None under safe_gate. The diagonal blocks (``diag_kernel``; T's into an array
    of their own, ``[T, H, 16]``), without safe_gate the flagged ones exactly (``exact_kernel``) and their inverses
    (``exact_inverse_kernel``), then the blocks below them and T whole (``below_kernel``).
    ``config`` overrides their launches (``{"diag": {...}, "exact": {...}, "inverse": {...}, "below": {...}}``:
    ``BK``, ``BH``, ``num_warps``, ``num_stages``). The exact rows have a kernel of their own: in a branch of the diagonal kernel
    their ``[16, K]`` tiles took its registers (245 at 2 warps against 163), and ``intra`` took 0.938 ms at normal
    decay and 2.029 under strong decay where the split takes 0.611 and 1.742 (H200, B=8, T=4096, H=16, K=128,
    at 04b1a87 and a17baeb).
    G ``[T, H]`` (one decay per head, Gated DeltaNet) gives every block by plain dots weighed afterwards
    (``blocks.diag_block``, ``blocks.below_scalar``), for any decay: no exact rows, ``flags`` unread; q and k may then
    have fewer heads than beta, H a multiple of theirs (grouped value heads, ``tiles.key_head``)."""
    total, H = beta.shape
    K = k.shape[-1]
    group = H // k.shape[1]
    config = config or {}
    scalar = G.dim() == 2
    assert scalar or group == 1, "grouped value heads with a [T, H] gate only"
    safe = flags is None or scalar
    T = allocate((total, H, chunks.size), chunks.size, row_scaled(precision), torch.float32, k.device)
    half = half_pairs(unit_rows, precision)
    P = torch.empty(total, H, chunks.size, device=k.device, dtype=p_dtype(half, scale))
    D = torch.empty(total, H, SUB, device=k.device, dtype=torch.float32)  # T's diagonal blocks (first A's: exact)
    if not (chunks.num_chunks and H):
        return T, P
    args = (q, k, G, beta, D, P, P if flags is None else flags, chunks.cu, chunks.seq, chunks.start, scale, H, K)
    fixed = dict(C=chunks.size, BC=SUB)
    dprec = diag_precision(precision, q.dtype)
    grouped = dict(SCALAR=scalar, GROUP=group)

    def narrow(cfg: dict) -> dict:  # channel blocks no wider than K's tile
        return cfg | dict(BK=min(cfg["BK"], padded(K)))
    launch(diag_kernel, (chunks.num_chunks * NB, H), args, fixed | dict(SAFE=safe, DPREC=dprec) | grouped,
           [narrow(DIAG_LAUNCH | config.get("diag", {}))])
    if not safe:
        cfg = exact_launch(K) | config.get("exact", {})
        launch(exact_kernel, (chunks.num_chunks * NB, triton.cdiv(H, cfg["BH"])), args[:3] + args[4:],
               fixed | dict(BK=padded(K)), [cfg])
        launch(exact_inverse_kernel, (chunks.num_chunks, H), (beta, D, flags, chunks.cu, chunks.seq, chunks.start, H),
               fixed | dict(DPREC=dprec), [INVERSE_LAUNCH | config.get("inverse", {})])
    launch(below_kernel, (chunks.num_chunks, H), args[:6] + (T.data, T.scale_ptr()) + args[7:],
           fixed | dict(PREC=precision, T_SCALED=T.scaled, HALF=half) | grouped,
           [narrow((BELOW_HALF_LAUNCH if half else BELOW_LAUNCH) | config.get("below", {}))])
    return T, P


def recurrence_outputs(keys: PreparedKeys, v, chunks: Chunks, scaled: bool, final: bool = False,
                       segments: Segments | None = None,
                       config: dict | None = None) -> tuple[Stored, Stored, torch.Tensor | None]:
    """``recurrence``'s h, U and with ``final`` the final state (``[N, H, K, V]`` fp32; else None), allocated (its
    launch's value blocks set the row scales'), for passes over parts of the sequences that write into the same ones."""
    total, H, V = v.shape
    K = keys.kg.shape[-1]
    launch_cfg = PREPARED_LAUNCH | launch_only(config)
    launch_cfg.pop("KB", None)
    block = serial_config(chunks if segments is None else segments.chunks, H, K, V, launch_cfg)["BV"]
    return (allocate((chunks.num_chunks, H, K, V), block, scaled, torch.float32, v.device),
            allocate((total, H, V), block, scaled, torch.float32, v.device),
            torch.empty(chunks.num_seqs, H, K, V, device=v.device, dtype=torch.float32) if final else None)


def recurrence(keys: PreparedKeys, v, G, beta, T: Stored, initial_state, chunks: Chunks, precision: str, *, final: bool,
               scaled: bool = False, segments: Segments | None = None, transitions: Transitions | None = None,
               config: dict | None = None, select: Selection | None = None,
               stored: tuple[Stored, Stored, torch.Tensor | None] | None = None,
               output: tuple[torch.Tensor, torch.Tensor, float] | None = None, states: bool = True):
    """Walk the chunks, on the operands prepared from k and G (``chunk.prepared``) and ``intra``'s T. Returns ``(final state,
    h, U, transitions)``: the fp32 final state ``[N, H, K, V]`` (None unless ``final``), the entry states h
    ``[NC, H, K, V]`` and U ``[T, H, V]``, both ``scaled.Stored`` (None where not ``states``), fp32 or with ``scaled``
    row-scaled fp16 (``chunk.scaled``: for "tf32" dots only); ``segments``: the sequences cut into segments that run
    side by side (``chunk.segments``), whose ``Transitions`` come last (None without segments).
    ``output``: ``(P, o, scale)``, the forward's output formed in the pass, ``O = scale Qg S0 + P U`` into o (``Qg =
    q e^G`` prepared, ``keys.qg``; P ``intra``'s). Where the prepared operands are fp16 ("tf32"), the dots of Kg and Qg
    take the state in fp16 over a power of two (``state.half_state``; a "tf32" dot truncated it to the same 11
    significant bits): measured on an H200 (bf16, B=8, T=4096, H=16, K=V=128, the pass with its output) 0.410 ->
    0.394 ms, at B=1, T=32768 over segments 0.970 -> 0.923; a power of two a state block, each block's product scaled
    apart, 0.490 (spilling); the state cast to fp16 with no scale (not safe: fp16 ends at 65504) 0.361, and every dot
    of the pass in fp16 so 0.313 (at c3f279a). The output in the pass, measured on an H200 (same shape, at
    c4e3a2a): 0.601 ms as two kernels (the pass storing
    h in bf16 and U row-scaled, an output kernel reading them), 0.619 fused with T in fp32 (123 KB of shared memory,
    one program an SM), 0.412 with T row-scaled fp16 (115.6 KB, two an SM; the forward 1.645 -> 1.449 ms).
    ``transitions``: a forward pass's over the same segments, so that this pass (the backward's recomputation)
    is ``chunk.segments``' step 3 alone (no final state). ``config`` overrides the launch (``BV``, ``TMA``,
    ``num_warps``, ``num_stages``; ``KB``: the state blocks' rows, ``state_width`` by default).
    ``select`` (without segments): the sequences of a ``Selection`` only, into ``stored`` (h, U, the final state or
    None) where given (``recurrence_outputs``; the backward's passes by sequence groups, ``state.sequence_groups``,
    ``api``). G: ``[T, H, K]``, or ``[T, H]`` (one decay per head, Gated DeltaNet), whose prepared operands may have
    fewer heads than v, H a multiple of theirs (grouped value heads: their row scales have v's heads)."""
    total, H, V = v.shape
    K = keys.kg.shape[-1]
    group = H // keys.kg.shape[1]
    dev = v.device
    launch_cfg = PREPARED_LAUNCH | launch_only(config)
    width = launch_cfg.pop("KB", state_width(scaled))
    if states:
        hs, U, ht = stored or recurrence_outputs(keys, v, chunks, scaled, False, segments, config)
    else:  # placeholders no launch writes (h's shaped as its descriptor's array)
        hs, U, ht = Stored(torch.empty(1, K, V, device=dev)), Stored(v), None
    KB, C = keys.state_rows(width), chunks.size
    assert output is None or keys.qg is not None, "the output's pass reads q e^G prepared (keys.qg)"
    # pointers no launch reads without output
    qg, sq = (keys.qg, keys.sq) if output is not None else (keys.kg, keys.sg)
    P, o, scale = output if output is not None else (T.data, v, 1.0)

    def walk(over: Chunks, h0, W: int, steps: bool, store_final: bool | None = None, select: Selection | None = None,
             ht: torch.Tensor | None = None):
        store_final = not steps if store_final is None else store_final
        BV = serial_config(over, H, K, W, launch_cfg)["BV"]  # this launch's (a segments' transition has W > V)
        tma, (kg, kd, vd, Td, hd, qgd, Pd) = tma_operands(
            config, (keys.kg, [C, 1, KB]), (keys.kd, [C, 1, KB]), (v, [C, 1, BV]), (T.data, [C, 1, C]),
            (hs.data.view(-1, K, V), [1, KB, BV]), (qg, [C, 1, KB]), (P, [C, 1, C]))
        if store_final and ht is None:
            ht = torch.empty(over.num_seqs, H, K, W, device=dev, dtype=torch.float32)
        launch_serial(recurrence_kernel,
                      (kg, keys.sg, kd, keys.sd, vd, G, beta, Td, T.scale_ptr(), h0 if h0 is not None else hs.data,
                       ht if store_final else hs.data, hd, hs.scale_ptr(), U.data, U.scale_ptr(), qgd, sq, Pd, o,
                       over.cu, over.offsets, over.cu if select is None else select.seqs, scale, H, K, V, W),
                      dict(HAS_H0=h0 is not None, STORE_FINAL=store_final, STEPS=steps and states, SCALED=scaled,
                           T_SCALED=T.scaled, OUTPUT=steps and output is not None,
                           HALF=keys.kg.dtype == torch.float16,
                           PREC=precision, TMA=tma, SELECT=select is not None, SCALAR=G.dim() == 2, GROUP=group,
                           SCALES_IN_DOT=G.dim() == 3)
                      | keys.constexprs, over, H, K, W, launch_cfg, max_block=KB, select=select)
        return ht

    if segments is None:
        ht = walk(chunks, initial_state, V, True, final, select, ht)
    else:
        assert select is None, "a pass over segments runs every sequence"
        if transitions is not None:
            assert not final, "a pass from the forward's segment entry states has no final state of its own"
            walk(segments.chunks, transitions.entries, V, True)
        else:
            ht, transitions = run(walk, segments, initial_state, H, K, V)
        ht = ht if final else None
    return (ht, hs, U, transitions) if states else (ht, None, None, transitions)
