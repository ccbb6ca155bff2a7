"""K-blocks of the recurrent state for the sequential (chunk-by-chunk) kernels.

The serial kernels hold a state ``S [K, BV]`` (or its gradient) in registers for a whole sequence.
Per chunk they need the K-side tiles ``k e^G``, ``q e^G``, ``k e^{G_last - G}`` ``[C, K]``: formed
for all of K at once they would not fit in registers. So the state lives in up to four blocks
``S_b [KB, BV]`` (``KB = min(K, 64)`` padded, ``NKB = KP / KB``), named variables in the kernels, and
every helper here reads the K-side tiles of one block only, right before its dot.

Conventions: ``rows`` are the chunk's token rows (masked past its end by ``rmask``), ``grows`` the
same rows clamped to the last valid one (for G, so that padded rows decay nothing), ``last`` the
chunk's last valid token.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .tiles import load_tile


@triton.jit
def block_cols(kb: tl.constexpr, KB: tl.constexpr, K):
    kk = kb * KB + tl.arange(0, KB)
    return kk, kk < K


@triton.jit
def state_ptrs(ptr, idx, K, V, kb: tl.constexpr, KB: tl.constexpr, vv, vmask):
    """Pointers and mask of block kb of state ``idx`` in a ``[*, K, V]`` fp32 array."""
    kk, kmask = block_cols(kb, KB, K)
    return ptr + (idx.to(tl.int64) * K + kk[:, None]) * V + vv[None, :], kmask[:, None] & vmask[None, :]


@triton.jit
def load_state(ptr, idx, K, V, kb: tl.constexpr, KB: tl.constexpr, BV: tl.constexpr, vv, vmask,
               PRESENT: tl.constexpr):
    """Block kb of state ``idx`` (zeros when not ``PRESENT``)."""
    if PRESENT:
        p, m = state_ptrs(ptr, idx, K, V, kb, KB, vv, vmask)
        out = tl.load(p, mask=m, other=0.0)
    else:
        out = tl.zeros((KB, BV), tl.float32)
    return out


@triton.jit
def store_state(ptr, S, idx, K, V, kb: tl.constexpr, KB: tl.constexpr, vv, vmask):
    p, m = state_ptrs(ptr, idx, K, V, kb, KB, vv, vmask)
    tl.store(p, S, mask=m)


@triton.jit
def decays(G_ptr, grows, last, h, H, K, kk, kmask):
    """``(e^G [C, KB], e^{G_last - G} [C, KB], e^{G_last} [KB])`` of one K-block."""
    G = load_tile(G_ptr, grows, grows >= 0, h, H, K, kk, kmask)
    G_last = tl.load(G_ptr + (last.to(tl.int64) * H + h) * K + kk, mask=kmask, other=0.0)
    return tl.exp(G), tl.exp(G_last[None, :] - G), tl.exp(G_last)


@triton.jit
def read_block(S, Z, O, q_ptr, k_ptr, G_ptr, rows, rmask, grows, h, H, K, scale, kb: tl.constexpr,
               KB: tl.constexpr, WITH_O: tl.constexpr, PREC: tl.constexpr):
    """Forward, block kb: ``Z -= (k e^G) S_b`` and ``O += scale (q e^G) S_b``."""
    kk, kmask = block_cols(kb, KB, K)
    G = load_tile(G_ptr, grows, grows >= 0, h, H, K, kk, kmask)
    eG = tl.exp(G)
    k = load_tile(k_ptr, rows, rmask, h, H, K, kk, kmask)
    Z -= tl.dot(k * eG, S, input_precision=PREC)
    if WITH_O:
        q = load_tile(q_ptr, rows, rmask, h, H, K, kk, kmask)
        O += tl.dot(q * (eG * scale), S, input_precision=PREC)
    return Z, O


@triton.jit
def write_block(S, U, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, kb: tl.constexpr, KB: tl.constexpr,
                PREC: tl.constexpr):
    """Forward, block kb: ``S_b <- e^{G_last} S_b + (k e^{G_last - G})^T U``."""
    kk, kmask = block_cols(kb, KB, K)
    _, e_d, gamma = decays(G_ptr, grows, last, h, H, K, kk, kmask)
    k = load_tile(k_ptr, rows, rmask, h, H, K, kk, kmask)
    return gamma[:, None] * S + tl.dot(tl.trans(k * e_d), U, input_precision=PREC)


@triton.jit
def dread_block(dS, dU, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, kb: tl.constexpr, KB: tl.constexpr,
                PREC: tl.constexpr):
    """Backward, block kb: ``dU += (k e^{G_last - G}) dS_b``."""
    kk, kmask = block_cols(kb, KB, K)
    _, e_d, _ = decays(G_ptr, grows, last, h, H, K, kk, kmask)
    k = load_tile(k_ptr, rows, rmask, h, H, K, kk, kmask)
    return dU + tl.dot(k * e_d, dS, input_precision=PREC)


@triton.jit
def dwrite_block(dS, do, bdY, q_ptr, k_ptr, G_ptr, rows, rmask, grows, last, h, H, K, scale, kb: tl.constexpr,
                 KB: tl.constexpr, PREC: tl.constexpr):
    """Backward, block kb: ``dS_b <- e^{G_last} dS_b + scale (q e^G)^T dO - (k e^G)^T (beta dY)``."""
    kk, kmask = block_cols(kb, KB, K)
    eG, _, gamma = decays(G_ptr, grows, last, h, H, K, kk, kmask)
    q = load_tile(q_ptr, rows, rmask, h, H, K, kk, kmask)
    k = load_tile(k_ptr, rows, rmask, h, H, K, kk, kmask)
    dS = gamma[:, None] * dS + tl.dot(tl.trans(q * (eG * scale)), do, input_precision=PREC)
    return dS - tl.dot(tl.trans(k * eG), bdY, input_precision=PREC)
