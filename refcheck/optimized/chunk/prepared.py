"""Operands of KDA's serial state passes, formed in parallel before them: per chunk, with ``T Diag(beta)``
the WY factor of the delta rule (``chunk_fwd``),

    W  = T Diag(beta) (k e^G)    [C, K]     (what the state reads: U = U0 - W S0)
    U0 = T Diag(beta) V          [C, V]     (fp32)
    Kd = k e^{G_last - G}        [C, K]     (what the state writes: S1 = Diag(gamma) S0 + Kd^T U)
    Qg = q e^G                   [C, K]     (the backward's: dS0 = Diag(gamma) dS1 + scale Qg^T dO - W^T dU)

The serial kernels walk the chunks of a sequence one after another, so each chunk's latency adds up: a
step that loads k and G, forms ``e^G`` and ``e^{G_last - G}`` on ``[C, K]`` tiles and only then reaches
its dots waits on all of it, and its loads cannot be issued ahead (the pipeliner prefetches loads that
feed dots). Formed here, one program per (chunk, head, state block), the operands are plain loads
into the serial step's dots, which the pass double-buffers; with W and U0 a step is two dependent dots
(``W S``, then ``Kd^T U``) where ``T (Diag(beta) (V - k e^G S))`` made it three, and the reverse pass
likewise (``Kd dS``, then ``W^T dU``; ``dY = T^T dU`` follows in parallel, ``chunk_bwd.grads_v_kernel``).

W, Kd and Qg are stored as ``x = s * X`` with ``s [T, H, NKB]`` the largest magnitude of each row within
each state block (``state.state_blocks``) and ``X`` in ``operand_dtype(precision)``: fp16 where the dots
run at "tf32", which rounds its operands to the same 11 significant bits, so storing them in fp16 loses
nothing the dot keeps (and the row scale keeps them in fp16's range whatever the input's magnitude); fp32
for "ieee" and "tf32x3". The pass applies the row scales outside its dots:

    (x S)_i = s_i (X S)_i,        x^T U = X^T (Diag(s) U)

U0 stays fp32: the pass subtracts ``W S`` from it, no dot rounds it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common import Chunks, launch
from .state import state_blocks
from .tiles import chunk_rows, decay, load_gate, load_gate_row, load_rowvec, load_tile, row_offsets, store_tile


def operand_dtype(precision: str) -> torch.dtype:
    """fp16 under "tf32" (the dot keeps 11 significant bits of an fp32 operand: fp16's), else fp32."""
    return torch.float16 if precision == "tf32" else torch.float32


@triton.jit
def store_scaled(x_ptr, s_ptr, x, rows, rmask, h, H, K, kb, NKB, cols, cmask):
    """``x [C, KB]`` as its row scales ``s[rows, h, kb]`` and ``x / s`` in ``x_ptr``'s dtype."""
    s = tl.max(tl.abs(x), axis=1)
    s = tl.where(s > 0, s, 1.0)
    store_tile(x_ptr, x / s[:, None], rows, rmask, h, H, K, cols, cmask)
    tl.store(s_ptr + row_offsets(rows, h, H, NKB) + kb, s, mask=rmask)


@triton.jit
def prepare_kernel(k_ptr, q_ptr, v_ptr, G_ptr, beta_ptr, T_ptr, w_ptr, sw_ptr, kd_ptr, sd_ptr, u0_ptr, qg_ptr, sq_ptr,
                   cu_ptr, seq_ptr, start_ptr, H, K, V, NKB, C: tl.constexpr, KB: tl.constexpr, WITH_Q: tl.constexpr,
                   PREC: tl.constexpr):
    """One chunk, head and state block kb: W and Kd of the block and with ``WITH_Q`` Qg, row-scaled, and
    U0 at value columns ``[v0, v0 + KB)`` for ``v0 = kb KB, (kb + NKB) KB, ...``."""
    t0, n, i, rows, rmask, grows = chunk_rows(tl.program_id(0), cu_ptr, seq_ptr, start_ptr, C)
    h = tl.program_id(1)
    kb = tl.program_id(2)
    cols = kb * KB + tl.arange(0, KB)
    cmask = cols < K
    k = load_tile(k_ptr, rows, rmask, h, H, K, cols, cmask)
    G = load_gate(G_ptr, grows, grows >= 0, h, H, K, cols, cmask)
    G_last = load_gate_row(G_ptr, t0 + n - 1, h, H, K, cols, cmask)
    eG = decay(G)
    # T Diag(beta): column j of T is token j of the chunk
    Tb = load_tile(T_ptr, rows, rmask, h, H, C, i, i < C) * load_rowvec(beta_ptr, rows, rmask, h, H)[None, :]
    store_scaled(w_ptr, sw_ptr, tl.dot(Tb, k * eG, input_precision=PREC), rows, rmask, h, H, K, kb, NKB, cols, cmask)
    store_scaled(kd_ptr, sd_ptr, k * decay(G_last[None, :] - G), rows, rmask, h, H, K, kb, NKB, cols, cmask)
    if WITH_Q:
        store_scaled(qg_ptr, sq_ptr, load_tile(q_ptr, rows, rmask, h, H, K, cols, cmask) * eG, rows, rmask, h, H, K,
                     kb, NKB, cols, cmask)
    cv = tl.arange(0, KB)
    for v0 in range(kb * KB, V, NKB * KB):
        vmask = v0 + cv < V
        U0 = tl.dot(Tb, load_tile(v_ptr + v0, rows, rmask, h, H, V, cv, vmask), input_precision=PREC)
        store_tile(u0_ptr + v0, U0, rows, rmask, h, H, V, cv, vmask)


class PreparedKeys(NamedTuple):
    """A pass's prepared operands (``[T, H, K]`` in ``operand_dtype``) and their row scales (fp32
    ``[T, H, NKB]``): ``W``, ``Kd``, and ``Qg`` where the pass needs it (None else); ``U0`` (fp32
    ``[T, H, V]``)."""

    w: torch.Tensor
    sw: torch.Tensor
    kd: torch.Tensor
    sd: torch.Tensor
    u0: torch.Tensor
    qg: torch.Tensor | None = None
    sq: torch.Tensor | None = None


def prepare_keys(k, v, G, beta, T, chunks: Chunks, precision: str, q=None) -> PreparedKeys:
    """The operands of KDA's state passes from k, v, beta, the cumulative gate G and the WY factor T
    (``chunk_fwd.intra``), and q for the backward's pass."""
    total, H, K = k.shape
    V = v.shape[-1]
    KB, NKB = state_blocks(K)

    def operand():
        return (torch.empty(total, H, K, device=k.device, dtype=operand_dtype(precision)),
                torch.empty(total, H, NKB, device=k.device, dtype=torch.float32))
    (w, sw), (kd, sd) = operand(), operand()
    qg, sq = operand() if q is not None else (None, None)
    u0 = torch.empty(total, H, V, device=k.device, dtype=torch.float32)
    if chunks.num_chunks and H:
        launch(prepare_kernel, (chunks.num_chunks, H, NKB),
               (k, k if q is None else q, v, G, beta, T, w, sw, kd, sd, u0, w if qg is None else qg,
                sw if sq is None else sq, chunks.cu, chunks.seq, chunks.start, H, K, V, NKB),
               dict(C=chunks.size, KB=KB, WITH_Q=q is not None, PREC=precision), [dict(num_warps=4, num_stages=1)])
    return PreparedKeys(w, sw, kd, sd, u0, qg, sq)
