"""The KDA decay gate in Triton, forward and backward, fused with the chunk-local cumulative sum.

Per head h and channel c, with ``x = g + dt_bias[h*K + c]`` and ``a = exp(A_log[h])``:

* softplus form (``lower_bound is None``): ``gate = -a * softplus(x)``,
  ``d gate/dx = -a * sigmoid(x)``, ``d gate/dA_log = gate``;
* sigmoid form: ``gate = lb * sigmoid(a x)``, ``d gate/dx = lb * s'(a x) * a``,
  ``d gate/dA_log = lb * s'(a x) * a x`` with ``s' = sigmoid (1 - sigmoid)``.

Chunked KDA needs ``G[t] = sum_{t0 <= s <= t} gate[s]`` within each chunk ``[t0, t0 + C)``
(restarting at every chunk and every sequence); ``gate_cumsum`` computes it from the raw gate input
(fp32, bf16 or fp16, converted in registers) in one pass, for ``kda_gate``, for fp32 inputs (whose G is fp64) and for
the gate's function in KDA's kernels; otherwise KDA's forward sums it in its front (``chunk_cumsum``, ``kda.front``).
The backward of that cumulative sum is a reverse cumulative sum within the chunk; ``gate_backward`` chains it through
the gate function and leaves per-chunk partial sums for ``A_log`` and ``dt_bias`` that the caller adds up.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import Chunks, padded


@triton.jit
def log1p_small(y):
    """``log(1 + y)`` for ``0 <= y <= 1`` to fp32 relative accuracy: a degree-8 series below 0.1
    (truncation below 1e-9), ``log`` above (where ``log(1 + y) >= 0.095`` hides its absolute error)."""
    series = y * (1 - y * (1 / 2 - y * (1 / 3 - y * (1 / 4 - y * (1 / 5 - y * (1 / 6 - y * (1 / 7 - y / 8)))))))
    return tl.where(y < 0.1, series, tl.log(1 + y))


@triton.jit
def softplus(x):
    """``log(1 + e^x) = max(x, 0) + log1p(e^{-|x|})``, accurate for every x."""
    return tl.maximum(x, 0.0) + log1p_small(tl.exp(-tl.abs(x)))


@triton.jit
def sigmoid(x):
    """``1 / (1 + e^{-x})`` without overflow: ``e^x / (1 + e^x)`` for negative x."""
    e = tl.exp(-tl.abs(x))
    s = 1 / (1 + e)
    return tl.where(x >= 0, s, e * s)


@triton.jit
def gate_value(x, rate, lower_bound, USE_LB: tl.constexpr):
    """The gate of ``x = g + dt_bias`` with ``rate = exp(A_log[h])`` (see the module docstring)."""
    if USE_LB:
        out = lower_bound * sigmoid(rate * x)
    else:
        out = -rate * softplus(x)
    return out


@triton.jit
def gate_partials(x, rate, lower_bound, USE_LB: tl.constexpr):
    """``(d gate / dx, d gate / dA_log)`` at ``x = g + dt_bias``."""
    if USE_LB:
        z = rate * x
        e = tl.exp(-tl.abs(z))
        ds = e / ((1 + e) * (1 + e))  # sigmoid'(z), symmetric in z
        d_x = lower_bound * ds * rate
        d_a = lower_bound * ds * z
    else:
        d_x = -rate * sigmoid(x)
        d_a = -rate * softplus(x)
    return d_x, d_a


@triton.jit
def load_gate_input(g_ptr, bias_ptr, rows, rmask, cols, cmask, h, H, K, HAS_BIAS: tl.constexpr):
    """``x = g + dt_bias`` for a tile of tokens ``rows`` [R] and channels ``cols`` [BK], in fp32."""
    off = (rows.to(tl.int64)[:, None] * H + h) * K + cols[None, :]
    x = tl.load(g_ptr + off, mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + h * K + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return x


@triton.jit
def chunk_cumsum(x, C: tl.constexpr):
    """The inclusive cumulative sum over the rows of a chunk's tile x ``[C, BK]`` (zeros past the chunk's end, so that
    those rows repeat the last valid one), fp32, as tensor-core products with the lower triangle of ones: a 16-bit x as
    it is (one dot, every product exact, the sums in fp32), an fp32 x as three bf16 parts that add up to it exactly
    (``hi = bf16(x)``, ``mid = bf16(x - hi)``, ``lo = x - hi - mid``: three dots, each part's sums added smallest
    first). The tensor core truncates its sums where they do not fit fp32 (``runtime.interpreter._mma``, fitted on an
    H200): on log-decays spanning four decades, within 1.6, 2.5 and 2.2 ulps of the float64 sums for bf16, fp16 and
    fp32 x, where a sequential fp32 sum is within 1.5, 3.0 and 6.2 (``tests/test_optimized_kda.py``); bf16 log-decays
    of one decade mostly sum exactly."""
    i = tl.arange(0, C)
    lower = i[:, None] >= i[None, :]
    if x.dtype == tl.float32:
        ones = lower.to(tl.bfloat16)
        hi = x.to(tl.bfloat16)
        rest = x - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
        out = tl.dot(ones, hi, out_dtype=tl.float32) + (
            tl.dot(ones, mid, out_dtype=tl.float32) + tl.dot(ones, lo, out_dtype=tl.float32))
    else:
        out = tl.dot(lower.to(x.dtype), x, out_dtype=tl.float32)
    return out


@triton.jit
def gate_forward_kernel(g_ptr, alog_ptr, bias_ptr, out_ptr, cu_ptr, seq_ptr, start_ptr, lower_bound, H, K,
                        C: tl.constexpr, BK: tl.constexpr, USE_GATE: tl.constexpr, HAS_BIAS: tl.constexpr,
                        USE_LB: tl.constexpr, CUMSUM: tl.constexpr):
    """One chunk of C tokens and one head: ``out = gate(g)`` (``USE_GATE``) or ``g``, then the
    inclusive cumulative sum over the chunk's tokens when ``CUMSUM``, summed and stored in out's dtype
    ``[T, H, K]``."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    t0 = tl.load(start_ptr + c)
    eos = tl.load(cu_ptr + tl.load(seq_ptr + c) + 1)
    i = tl.arange(0, C)
    rmask = t0 + i < eos
    rate = 1.0
    if USE_GATE:
        rate = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        cmask = cols < K
        x = load_gate_input(g_ptr, bias_ptr, t0 + i, rmask, cols, cmask, h, H, K, HAS_BIAS)
        if USE_GATE:
            x = tl.where(rmask[:, None], gate_value(x, rate, lower_bound, USE_LB), 0.0)
        if CUMSUM:
            x = tl.cumsum(x.to(out_ptr.dtype.element_ty), axis=0)
        off = ((t0 + i).to(tl.int64)[:, None] * H + h) * K + cols[None, :]
        tl.store(out_ptr + off, x, mask=rmask[:, None] & cmask[None, :])


@triton.jit
def gate_backward_tile(dgate, g_ptr, bias_ptr, dg_ptr, rows, rmask, cols, cmask, h, H, K, rate, lower_bound,
                       HAS_BIAS: tl.constexpr, USE_LB: tl.constexpr):
    """Chain ``dgate`` (fp32 [R, BK], the gradient of the gate values of tokens ``rows``) through the
    gate: store ``dg`` (g's dtype); return the tile's contributions to ``dA_log[h]`` and to ``dt_bias[h, cols]``,
    per channel (``([BK], [BK])``)."""
    x = load_gate_input(g_ptr, bias_ptr, rows, rmask, cols, cmask, h, H, K, HAS_BIAS)
    d_x, d_a = gate_partials(x, rate, lower_bound, USE_LB)
    mask = rmask[:, None] & cmask[None, :]
    dx = tl.where(mask, dgate * d_x, 0.0)
    off = (rows.to(tl.int64)[:, None] * H + h) * K + cols[None, :]
    tl.store(dg_ptr + off, dx.to(dg_ptr.dtype.element_ty), mask=mask)
    return tl.sum(tl.where(mask, dgate * d_a, 0.0), axis=0), tl.sum(dx, axis=0)


@triton.jit
def gate_backward_kernel(dgate_ptr, g_ptr, alog_ptr, bias_ptr, dg_ptr, da_ptr, ddt_ptr, lower_bound, total, H, K,
                         R: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr, USE_LB: tl.constexpr):
    """Standalone gate backward over R tokens and one head: ``dg`` and the block's partial sums
    ``da[blk, h]``, ``ddt[blk, h, :]``."""
    blk = tl.program_id(0)
    h = tl.program_id(1)
    rows = blk * R + tl.arange(0, R)
    rmask = rows < total
    rate = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    da = tl.zeros((BK,), tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        cmask = cols < K
        off = (rows.to(tl.int64)[:, None] * H + h) * K + cols[None, :]
        dgate = tl.load(dgate_ptr + off, mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        da_k, ddt_k = gate_backward_tile(dgate, g_ptr, bias_ptr, dg_ptr, rows, rmask, cols, cmask, h, H, K, rate,
                                         lower_bound, HAS_BIAS, USE_LB)
        da += da_k
        tl.store(ddt_ptr + (blk.to(tl.int64) * H + h) * K + cols, ddt_k, mask=cmask)
    tl.store(da_ptr + blk * H + h, tl.sum(da, axis=0))


def gate_cumsum(g: torch.Tensor, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
                lower_bound: float | None, chunks: Chunks, cumsum: bool = True,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[T, H, K]`` in ``dtype``: the gate of g (``A_log`` given) or g itself, cumulated per chunk when
    ``cumsum`` (in ``dtype``: fp64 for fp32 inputs, ``chunk.tiles.cumulative_gate_dtype``). g is
    ``[T, H, K]`` (tokens flattened), any float dtype, read as is."""
    total, H, K = g.shape
    out = torch.empty(total, H, K, device=g.device, dtype=dtype)
    if chunks.num_chunks and H:
        bk = min(padded(K), 64)
        use_gate = A_log is not None
        gate_forward_kernel[(chunks.num_chunks, H)](
            g, A_log if use_gate else g, dt_bias if dt_bias is not None else g, out, chunks.cu, chunks.seq,
            chunks.start, float(lower_bound or 0.0), H, K, C=chunks.size, BK=bk, USE_GATE=use_gate,
            HAS_BIAS=use_gate and dt_bias is not None, USE_LB=lower_bound is not None, CUMSUM=cumsum)
    return out


def gate_backward(dgate: torch.Tensor, g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None,
                  lower_bound: float | None):
    """Gradients of ``kda_gate`` for tokens-flattened ``g [T, H, K]`` and fp32 ``dgate``:
    ``(dg in g.dtype, dA_log [H] fp32, ddt_bias [H*K] fp32 or None)``."""
    total, H, K = g.shape
    rows = 64
    blocks = triton.cdiv(total, rows)
    dg = torch.empty_like(g)
    da = torch.zeros(blocks, H, device=g.device, dtype=torch.float32)
    ddt = torch.zeros(blocks, H, K, device=g.device, dtype=torch.float32)
    if blocks and H:
        gate_backward_kernel[(blocks, H)](
            dgate, g, A_log, dt_bias if dt_bias is not None else g, dg, da, ddt, float(lower_bound or 0.0), total,
            H, K, R=rows, BK=min(padded(K), 64), HAS_BIAS=dt_bias is not None, USE_LB=lower_bound is not None)
    return dg, da.sum(0), (ddt.sum(0).reshape(H * K) if dt_bias is not None else None)
