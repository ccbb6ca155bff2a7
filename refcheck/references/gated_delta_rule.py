"""The gated delta rule with one scalar decay per head and step (Gated DeltaNet, Qwen3-Next).

Per sequence and head, with the state ``S`` of shape ``[K, V]`` and at step t
``q_t, k_t [K]``, ``v_t [V]``, ``g_t`` (scalar log-decay), ``beta_t`` (scalar):

    S'  = exp(g_t) S_{t-1}
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    o_t = scale * S_t^T q_t

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g, beta ``[B, T, HV]``; states ``[N, HV, K, V]``
(N: the number of sequences, B unless packed). ``HV`` value heads, a multiple of ``H`` (grouped value
heads, GVA: Qwen3-Next and Qwen3.5 run 16 query/key heads and 32 value heads): value head ``j`` reads
query/key head ``j // (HV // H)``, and the gradient of a query/key head sums over its group.
With ``use_gate_in_kernel`` the decay is computed from the raw gate ``g [B, T, HV]``, ``A_log [HV]``
and ``dt_bias [HV]`` (as the models' layers call FLA): ``g_t = -exp(A_log) * softplus(g_t + dt_bias)``
(``gates.kda_gate`` with one channel); ``A_log`` and ``dt_bias`` get gradients.
With ``use_qk_l2norm`` q and k are first divided by their L2 norm (``x / sqrt(sum(x^2) + 1e-6)``).
With ``use_beta_sigmoid_in_kernel`` beta holds logits and the step uses ``sigmoid(beta)``, or
``2 sigmoid(beta)`` in ``[0, 2)`` with ``allow_neg_eigval`` (the update's eigenvalue ``1 - beta`` may be
negative; FLA's option, which takes effect only with the sigmoid in the kernel). With ``state_v_first``
the states are laid out ``[N, HV, V, K]`` (the transpose of ``S``), initial and final alike.
A decode step over a state pool (serving): with ``ssm_state_indices [N]`` the initial state is a pool
``[P, HV, K, V]`` and sequence n starts from slot ``ssm_state_indices[n]``; with ``inplace_final_state``
its final state is written back into that slot, in place, and none is returned (as KDA's).
It is KDA (``kda.py``) with the decay ``g [B, T, H]`` broadcast over K, so both forms are KDA's:
``gated_delta_rule`` walks the recurrence, ``gated_delta_rule_chunked`` evaluates it in chunks.
"""
from __future__ import annotations

from .contract import check_shape, check_tensor
from .gates import kda_gate
from .kda import kda, kda_chunked


def check_gated_delta_rule_inputs(q, k, v, g, beta, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                  use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False) -> tuple[int, int]:
    """Validate what is the gated delta rule's own: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]`` with HV a
    multiple of H (grouped value heads), a scalar gate and beta ``[B, T, HV]``, ``A_log`` (and ``dt_bias``)
    ``[HV]`` exactly with ``use_gate_in_kernel``, ``allow_neg_eigval`` only with the sigmoid in the kernel.
    Returns ``(H, HV)``; a ValueError naming the argument otherwise."""
    check_tensor("q", q, 4)
    b, t, h, kd = q.shape
    check_tensor("k", k, 4)
    check_shape("k", k, q.shape, "[B, T, H, K] like q")
    check_tensor("v", v, 4)
    hv = v.shape[2]
    if v.shape[:2] != (b, t) or hv % h:
        raise ValueError(f"v: expected shape [B, T, HV, V] = [{b}, {t}, HV, V] with HV a multiple of q's "
                         f"H = {h} (grouped value heads), got {list(v.shape)}")
    check_tensor("g", g, 3)
    check_shape("g", g, (b, t, hv), "[B, T, HV]: one decay per value head and step")
    check_tensor("beta", beta, 3)
    check_shape("beta", beta, (b, t, hv), "[B, T, HV]")
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("A_log: required with use_gate_in_kernel=True ([HV], the decay rate's log)")
        check_tensor("A_log", A_log, 1)
        check_shape("A_log", A_log, (hv,), "[HV]")
        if dt_bias is not None:
            check_tensor("dt_bias", dt_bias, 1)
            check_shape("dt_bias", dt_bias, (hv,), "[HV]")
    else:
        for name, given in (("A_log", A_log), ("dt_bias", dt_bias)):
            if given is not None:
                raise ValueError(f"{name}: given without use_gate_in_kernel=True (it takes part in the gate only then)")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: given without use_beta_sigmoid_in_kernel=True (it scales the sigmoid "
                         "computed in the kernel only then)")
    return h, hv


def gva_operands(q, k, v, g, beta, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                 use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    """Validate the inputs (``check_gated_delta_rule_inputs``); return q and k with each query/key head
    repeated for the value heads of its group, the log-decay (computed from ``A_log`` and ``dt_bias`` with
    ``use_gate_in_kernel``) broadcast over K, and beta (its sigmoid, with ``use_beta_sigmoid_in_kernel``):
    KDA's operands, one head per value head."""
    h, hv = check_gated_delta_rule_inputs(q, k, v, g, beta, use_gate_in_kernel, A_log, dt_bias,
                                          use_beta_sigmoid_in_kernel, allow_neg_eigval)
    b, t, _, kd = q.shape
    if use_gate_in_kernel:
        g = kda_gate(g.unsqueeze(-1), A_log, dt_bias).squeeze(-1)
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2 if allow_neg_eigval else 1)
    group = hv // h
    q, k = (x.repeat_interleave(group, dim=2) if group > 1 else x for x in (q, k))
    return q, k, v, g.unsqueeze(-1).expand(b, t, hv, kd), beta


def _v_first(state, state_v_first: bool):
    """A state ``[N, HV, K, V]`` in the layout asked for (``[N, HV, V, K]`` with ``state_v_first``), or None."""
    return state.transpose(-1, -2) if state is not None and state_v_first else state


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                     ssm_state_indices=None, inplace_final_state=False):
    """The gated delta rule by its recurrence, evaluated in ``q.dtype`` (float64 for the truth).

    Returns ``(o [B, T, HV, V], final_state [N, HV, K, V] or None)`` (``[N, HV, V, K]`` with
    ``state_v_first``), computed in ``q.dtype``. A kernel's dtypes are the contract's: o in the input dtype,
    final_state in float32.
    """
    q, k, v, g, beta = gva_operands(q, k, v, g, beta, use_gate_in_kernel, A_log, dt_bias,
                                    use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, final = kda(q, k, v, g, beta, scale=scale, initial_state=_v_first(initial_state, state_v_first),
                   output_final_state=output_final_state, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                   ssm_state_indices=ssm_state_indices, inplace_final_state=inplace_final_state)
    return o, _v_first(final, state_v_first)


def gated_delta_rule_chunked(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None,
                             dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                             state_v_first=False, ssm_state_indices=None, inplace_final_state=False, chunk_size=64,
                             decays="stable"):
    """The gated delta rule in chunks of ``chunk_size`` (``kda_chunked``); same contract and result as
    ``gated_delta_rule`` (to rounding); ``decays`` as in ``kda_chunked``."""
    q, k, v, g, beta = gva_operands(q, k, v, g, beta, use_gate_in_kernel, A_log, dt_bias,
                                    use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, final = kda_chunked(q, k, v, g, beta, scale=scale, initial_state=_v_first(initial_state, state_v_first),
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                           chunk_size=chunk_size, decays=decays, ssm_state_indices=ssm_state_indices,
                           inplace_final_state=inplace_final_state)
    return o, _v_first(final, state_v_first)
