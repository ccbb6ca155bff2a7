"""The gated delta rule token by token (decode and short prefills), states in registers.

A program owns one sequence n, one value head hv (query/key head ``h = hv // (HV / H)``) and a block of BV
value columns of its state ``S [K, BV]`` (fp32, all K rows), read from ``initial_state[n]`` or from the pool
slot ``ssm_state_indices[n]``; for each of the sequence's tokens t:

    q, k    <- q_t, k_t of head h (fp32; divided by sqrt(sum x^2 + 1e-6) with l2norm)
    g       <- g_t, or -exp(A_log[hv]) softplus(g_t + dt_bias[hv]) with the gate in the kernel (``kda.gate``)
    beta    <- beta_t, or sigmoid(beta_t) (2 sigmoid(beta_t) with allow_neg_eigval)
    S       <- e^g S
    u       =  beta (v_t - S^T k)                  [BV]
    S       <- S + k u^T
    o_t     =  scale S^T q                         [BV]

then writes S to the final state, or back into its pool slot (in place). A program touches only its own
block of its own slot, so the in-place write races with nothing (``ssm_state_indices`` distinct: the
contract's). The state is read and written once per call: a decode step moves ``2 * 4 K V`` bytes per
sequence and value head and reads q, k, v once, so the kernel is bound by memory bandwidth.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..kda.gate import gate_value, sigmoid


@triton.jit
def state_offsets(slot, hv, HV, K: tl.constexpr, V: tl.constexpr, kk, vv, V_FIRST: tl.constexpr):
    """Offsets of ``state[slot, hv, kk, vv]`` (``[P, HV, K, V]``, or ``[P, HV, V, K]`` with V_FIRST)."""
    base = (slot.to(tl.int64) * HV + hv) * K * V
    if V_FIRST:
        return base + vv[None, :] * K + kk[:, None]
    return base + kk[:, None] * V + vv[None, :]


@triton.jit
def l2_normalized(x):
    """``x / sqrt(sum x^2 + 1e-6)`` (the contract's l2norm)."""
    return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_ptr, bias_ptr, h0_ptr, ht_ptr, idx_ptr, o_ptr, cu_ptr,
                     scale, H, HV, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     L2NORM: tl.constexpr, GATE: tl.constexpr, HAS_BIAS: tl.constexpr, BETA_SIGMOID: tl.constexpr,
                     NEG_EIGVAL: tl.constexpr, HAS_H0: tl.constexpr, POOL: tl.constexpr, STORE: tl.constexpr,
                     V_FIRST: tl.constexpr):
    """Value block ``program_id(0)`` of sequence ``program_id(1)``, value head ``program_id(2)`` (module
    docstring). STORE: write the final state into ``ht_ptr`` (the pool itself when the call is in place);
    POOL: sequence n's state lives in slot ``idx_ptr[n]`` of h0 (and of ht)."""
    n = tl.program_id(1)
    hv = tl.program_id(2)
    h = hv // (HV // H)
    kk = tl.arange(0, BK)
    vv = tl.program_id(0) * BV + tl.arange(0, BV)
    kmask = kk < K
    vmask = vv < V
    smask = kmask[:, None] & vmask[None, :]
    slot = n
    if POOL:
        slot = tl.load(idx_ptr + n)
    offsets = state_offsets(slot, hv, HV, K, V, kk, vv, V_FIRST)
    if HAS_H0:
        S = tl.load(h0_ptr + offsets, mask=smask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros((BK, BV), tl.float32)
    rate = 0.0
    bias = 0.0
    if GATE:
        rate = tl.exp(tl.load(a_ptr + hv).to(tl.float32))
        if HAS_BIAS:
            bias = tl.load(bias_ptr + hv).to(tl.float32)
    bos = tl.load(cu_ptr + n).to(tl.int64)
    eos = tl.load(cu_ptr + n + 1).to(tl.int64)
    for t in range(bos, eos):
        q = tl.load(q_ptr + (t * H + h) * K + kk, mask=kmask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (t * H + h) * K + kk, mask=kmask, other=0.0).to(tl.float32)
        if L2NORM:
            q = l2_normalized(q)
            k = l2_normalized(k)
        v = tl.load(v_ptr + (t * HV + hv) * V + vv, mask=vmask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + t * HV + hv).to(tl.float32)
        if GATE:
            g = gate_value(g + bias, rate, 0.0, False)
        beta = tl.load(beta_ptr + t * HV + hv).to(tl.float32)
        if BETA_SIGMOID:
            beta = sigmoid(beta)
            if NEG_EIGVAL:
                beta = 2.0 * beta
        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], axis=0))
        S = S + k[:, None] * u[None, :]
        o = scale * tl.sum(S * q[:, None], axis=0)
        tl.store(o_ptr + (t * HV + hv) * V + vv, o.to(o_ptr.dtype.element_ty), mask=vmask)
    if STORE:
        if not POOL:
            offsets = state_offsets(n, hv, HV, K, V, kk, vv, V_FIRST)
        tl.store(ht_ptr + offsets, S, mask=smask)


DEFAULT_CONFIG = {"BV": None, "num_warps": 1}
"""The launch: BV value columns a program (None: ``value_block``), num_warps."""


def value_block(k: int, v: int) -> int:
    """Value columns a program by default: the state block ``[K, BV]`` fp32 stays within 64 registers a thread at
    four warps (``K * BV <= 8192``), from 16 to 64."""
    bv = min(triton.next_power_of_2(v), 32)
    while bv > 16 and triton.next_power_of_2(k) * bv > 4096:
        bv //= 2
    return max(bv, 16)


def check_config(config: dict | None, k: int, v: int) -> dict:
    """The launch of ``config`` over ``DEFAULT_CONFIG``: BV None or a power of two from 16 (at most V's next power
    of two: no program of only masked columns), num_warps 1, 2, 4 or 8."""
    config = {**DEFAULT_CONFIG, **(config or {})}
    if set(config) != set(DEFAULT_CONFIG):
        raise ValueError(f"config: expected keys among {sorted(DEFAULT_CONFIG)}, got {sorted(config)}")
    bv, warps = config["BV"], config["num_warps"]
    if bv is None:
        bv = value_block(k, v)
    if isinstance(bv, bool) or not isinstance(bv, int) or bv < 16 or bv & (bv - 1):
        raise ValueError(f"config: BV must be None or a power of two from 16, got {bv!r}")
    if warps not in (1, 2, 4, 8):
        raise ValueError(f"config: num_warps must be 1, 2, 4 or 8, got {warps!r}")
    return {"BV": min(bv, max(16, triton.next_power_of_2(v))), "num_warps": warps}
