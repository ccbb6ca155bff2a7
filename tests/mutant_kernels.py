"""Triton kda_gate kernels for law 7's autotune part: ``kda_gate`` autotunes over two correct configs
(a control), ``kda_gate_drops_tail`` over a correct one and one that never writes the last partial
block (a tail mask rounded down to whole blocks: a mutant).

Imported only through their records in ``tests.mutants``, after
``refcheck.runtime.backend.configure_backend()`` has chosen compiled or interpreted Triton.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gate(g_ptr, a_ptr, bias_ptr, out_ptr, n, K, HK, lower,
          HAS_BIAS: tl.constexpr, HAS_LOWER: tl.constexpr, BLOCK: tl.constexpr, WHOLE_BLOCKS_ONLY: tl.constexpr):
    """gate = lower * sigmoid(exp(A_log[h]) * x) or -exp(A_log[h]) * softplus(x), x = g + dt_bias,
    over the flattened ``[B*T*H*K]`` gate input."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    limit = n // BLOCK * BLOCK if WHOLE_BLOCKS_ONLY else n
    mask = offs < limit
    hk = offs % HK
    x = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + hk, mask=mask, other=0.0)
    rate = tl.exp(tl.load(a_ptr + hk // K, mask=mask, other=0.0))
    if HAS_LOWER:
        y = lower * tl.sigmoid(rate * x)
    else:
        y = -rate * (tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
    tl.store(out_ptr + offs, y, mask=mask)


_gate_kernel = triton.autotune(key=["n"], configs=[triton.Config({"BLOCK": 32, "WHOLE_BLOCKS_ONLY": False}),
                                                   triton.Config({"BLOCK": 64, "WHOLE_BLOCKS_ONLY": False})])(_gate)
_gate_kernel_drops_tail = triton.autotune(key=["n"], configs=[
    triton.Config({"BLOCK": 32, "WHOLE_BLOCKS_ONLY": False}),
    triton.Config({"BLOCK": 64, "WHOLE_BLOCKS_ONLY": True})])(_gate)


def kda_gate(g, A_log, dt_bias=None, lower_bound=None):
    """The kda_gate contract, forward only (every config correct)."""
    return _launch(_gate_kernel, g, A_log, dt_bias, lower_bound)


def kda_gate_drops_tail(g, A_log, dt_bias=None, lower_bound=None):
    """The kda_gate contract, forward only; config 1 leaves the last partial block unwritten."""
    return _launch(_gate_kernel_drops_tail, g, A_log, dt_bias, lower_bound)


def _launch(kernel, g, A_log, dt_bias, lower_bound):
    """Launch an autotuned gate kernel over g ``[B, T, H, K]``; the gate comes back in float32."""
    _, _, h, k = g.shape
    g = g.contiguous()
    out = torch.empty(g.shape, dtype=torch.float32, device=g.device)
    n = g.numel()
    bias = dt_bias.float().contiguous() if dt_bias is not None else A_log

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK"]),)
    kernel[grid](g, A_log.float().contiguous(), bias, out, n, k, h * k,
                 0.0 if lower_bound is None else float(lower_bound),
                 HAS_BIAS=dt_bias is not None, HAS_LOWER=lower_bound is not None)
    return out


@triton.jit
def _add_far_read(x_ptr, out_ptr, n, odd, BLOCK: tl.constexpr):
    """``out[i] += x[i + 2**36]`` where ``odd`` is 1 (else nothing): an address far past any allocation,
    the kind a wrong stride computes. A GPU loses its CUDA context on it (an illegal memory access);
    the faithful interpreter raises."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    far = tl.load(x_ptr + offs.to(tl.int64) + (1 << 36), mask=inside & (odd == 1), other=0.0)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=inside) + far.to(tl.float32), mask=inside)


def kda_gate_crashes_on_odd_lengths(g, A_log, dt_bias=None, lower_bound=None):
    """The kda_gate contract, forward only: correct (the naive gate) where T, g's length, is even, an
    illegal memory access where it is odd (``_add_far_read``)."""
    from refcheck.model import naive
    out = naive.kda_gate(g, A_log, dt_bias, lower_bound).float().contiguous()
    _add_far_read[(triton.cdiv(g.numel(), 64),)](g.contiguous(), out, g.numel(), g.shape[1] % 2, BLOCK=64)
    return out
