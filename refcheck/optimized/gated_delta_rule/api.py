"""Public ``gated_delta_rule_recurrent``: the contract signature of ``references.gated_delta_rule``, input
checks once (``check_call``, which the chunked kernels' ``chunk.gated_delta_rule_chunk`` takes too), then
``recurrent.recurrent_kernel``. Forward only (serving's decode, and prefills short enough
to walk token by token): no autograd.

The checks are the contract's own (``references.gated_delta_rule.check_gated_delta_rule_inputs``, the state
pool's ``references.contract.check_state_pool``: it reads the slots back, a synchronization per call) plus what
the kernel needs: q, k, v of one dtype among fp32/bf16/fp16, every tensor on one device, head dims up to 256,
float32 states.
"""
from __future__ import annotations

import torch
import triton

from refcheck.references.contract import check_scale, check_shape, check_state_pool, check_tensor
from refcheck.references.gated_delta_rule import check_gated_delta_rule_inputs

from ..common import check_flag, check_runs_on, kernel_state, make_chunks
from .recurrent import check_config, recurrent_kernel

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256


def check_call(kernel, q, k, v, g, beta, scale, flags: dict, others: dict, one_dtype: bool):
    """The checks of a call of our kernels (the recurrent and the chunked), before any launch: the contract's
    (``check_gated_delta_rule_inputs``: shapes, grouped heads, the gate's parameters), ``flags`` booleans, q, k and v
    (with ``one_dtype`` all of q's; else each, and g and beta too) among fp32/bf16/fp16, ``inplace_final_state``
    with a pool's ``ssm_state_indices``, every tensor of ``others``
    (the gate's parameters, states, indices, cu_seqlens; None where not given) on q's device, a device the kernel
    runs on, head dims up to 256, the scale. Returns ``(B, T, H, K, HV, V, scale)``."""
    check_gated_delta_rule_inputs(q, k, v, g, beta, flags["use_gate_in_kernel"], others["A_log"], others["dt_bias"],
                                  flags["use_beta_sigmoid_in_kernel"], flags["allow_neg_eigval"])
    for name, flag in flags.items():
        check_flag(name, flag)
    if flags["inplace_final_state"] and others["ssm_state_indices"] is None:
        raise ValueError("inplace_final_state: needs ssm_state_indices (the pool slots to write back into)")
    typed = (("q", q), ("k", k), ("v", v)) if one_dtype else (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
    for name, x in typed:
        if x.dtype not in KERNEL_DTYPES or (one_dtype and x.dtype != q.dtype):
            raise ValueError(f"{name}: expected " + (f"{q.dtype} like q, one of " if one_dtype else "") +
                             f"fp32, bf16, fp16; got {x.dtype}")
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), *others.items()):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name}: expected a tensor on {q.device} like q, got {x.device}")
    check_runs_on("q", q, kernel)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    for name, d in (("q", K), ("v", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    return B, T, H, K, HV, V, check_scale(scale, K)


def gated_delta_rule_recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None,
                               dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                               state_v_first=False, ssm_state_indices=None, inplace_final_state=False,
                               check_slots=True, config=None):
    """The gated delta rule by its recurrence (``references.gated_delta_rule``): ``(o [B, T, HV, V] in
    q.dtype, final_state float32 [N, HV, K, V] or None)`` (``[N, HV, V, K]`` with ``state_v_first``).

    Per sequence and value head hv (query/key head ``hv // (HV / H)``), at each token
    ``S <- e^g S``, ``S <- S + beta k (v - S^T k)^T``, ``o = scale S^T q``. With ``ssm_state_indices [N]``
    the initial state is a pool ``[P, HV, K, V]`` and sequence n starts from slot ``ssm_state_indices[n]``;
    with ``inplace_final_state`` its final state is written back into that slot and None is returned.

    Knobs:
      check_slots: validate ``ssm_state_indices`` (in range, distinct when written back), which reads them back
                   to the host: a synchronization per call. False (a serving loop whose slots its scheduler
                   owns): unchecked, no synchronization; a slot outside the pool is then an illegal address.
      config:      the launch (``recurrent.DEFAULT_CONFIG``'s keys: ``BV`` value columns a program, ``num_warps``).
    """
    B, T, H, K, HV, V, scale = check_call(
        recurrent_kernel, q, k, v, g, beta, scale,
        dict(output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel,
             state_v_first=state_v_first, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
             allow_neg_eigval=allow_neg_eigval, inplace_final_state=inplace_final_state),
        dict(A_log=A_log, dt_bias=dt_bias, initial_state=initial_state, ssm_state_indices=ssm_state_indices,
             cu_seqlens=cu_seqlens), one_dtype=True)
    chunks = make_chunks(B, T, cu_seqlens, 64, q.device)              # validates cu_seqlens; its cu, the spans
    N = chunks.num_seqs
    sk, sv = (V, K) if state_v_first else (K, V)
    check_flag("check_slots", check_slots)
    config = check_config(config, K, V)
    if ssm_state_indices is not None:
        if check_slots:
            pool, _ = check_state_pool(initial_state, ssm_state_indices, N, HV, sk, sv, inplace=inplace_final_state,
                                       output_final_state=output_final_state)
        else:
            pool = initial_state
            check_tensor("ssm_state_indices", ssm_state_indices, 1, (torch.int32, torch.int64))
            check_shape("initial_state", pool, (pool.shape[0], HV, sk, sv), f"[P, {HV}, {sk}, {sv}]: a pool of states")
        if pool.dtype != torch.float32 or not pool.is_contiguous():
            raise ValueError(f"initial_state: expected a contiguous float32 pool, got {pool.dtype}"
                             + ("" if pool.is_contiguous() else ", not contiguous"))
        h0 = pool
    else:
        h0 = kernel_state(initial_state, N, HV, sk, sv, q.device)
    o = torch.empty(B, T, HV, V, device=q.device, dtype=q.dtype)
    store = output_final_state or inplace_final_state
    ht = h0 if inplace_final_state else (torch.empty(N, HV, sk, sv, device=q.device, dtype=torch.float32)
                                         if store else o)
    bv = config["BV"]
    if N:   # sequences without tokens still write their final state (the initial one, or zeros)
        recurrent_kernel[(triton.cdiv(V, bv), N, HV)](
            q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
            A_log if use_gate_in_kernel else q, dt_bias if dt_bias is not None else q, h0 if h0 is not None else o,
            ht, ssm_state_indices if ssm_state_indices is not None else chunks.cu, o, chunks.cu, scale, H, HV,
            K=K, V=V, BK=max(16, 1 << (K - 1).bit_length()), BV=bv, L2NORM=use_qk_l2norm, GATE=use_gate_in_kernel,
            HAS_BIAS=dt_bias is not None, BETA_SIGMOID=use_beta_sigmoid_in_kernel, NEG_EIGVAL=allow_neg_eigval,
            HAS_H0=h0 is not None, POOL=ssm_state_indices is not None, STORE=store, V_FIRST=state_v_first,
            num_warps=config["num_warps"])
    return o, (ht if output_final_state else None)
