"""The gated delta rule with one scalar decay per head and step (Gated DeltaNet, Qwen3-Next).

Per sequence and head, with the state ``S`` of shape ``[K, V]`` and at step t
``q_t, k_t [K]``, ``v_t [V]``, ``g_t`` (scalar log-decay), ``beta_t`` (scalar):

    S'  = exp(g_t) S_{t-1}
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    o_t = scale * S_t^T q_t

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; states ``[N, H, K, V]``
(N: the number of sequences, B unless packed).
With ``use_qk_l2norm`` q and k are first divided by their L2 norm (``x / sqrt(sum(x^2) + 1e-6)``).
It is KDA (``kda.py``) with the decay ``g [B, T, H]`` broadcast over K, so both forms are KDA's:
``gated_delta_rule`` walks the recurrence, ``gated_delta_rule_chunked`` evaluates it in chunks.
"""
from __future__ import annotations

from .contract import check_linear_qkv, check_shape, check_tensor
from .kda import kda, kda_chunked


def check_gated_delta_rule_inputs(q, k, v, g, beta) -> None:
    """Validate what is the gated delta rule's own: a scalar gate and beta ``[B, T, H]``."""
    b, t, h, _, _ = check_linear_qkv(q, k, v)
    check_tensor("g", g, 3)
    check_shape("g", g, (b, t, h), "[B, T, H]: one decay per head and step")
    check_tensor("beta", beta, 3)
    check_shape("beta", beta, (b, t, h), "[B, T, H]")


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, use_qk_l2norm=False):
    """The gated delta rule by its recurrence, evaluated in ``q.dtype`` (float64 for the truth).

    Returns ``(o [B, T, H, V], final_state [N, H, K, V] or None)``, computed in ``q.dtype``. A kernel's
    dtypes are the contract's: o in the input dtype, final_state in float32.
    """
    check_gated_delta_rule_inputs(q, k, v, g, beta)
    return kda(q, k, v, g.unsqueeze(-1).expand(q.shape), beta, scale=scale, initial_state=initial_state,
               output_final_state=output_final_state, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm)


def gated_delta_rule_chunked(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None, use_qk_l2norm=False, chunk_size=64, decays="stable"):
    """The gated delta rule in chunks of ``chunk_size`` (``kda_chunked``); same contract and result as
    ``gated_delta_rule`` (to rounding); ``decays`` as in ``kda_chunked``."""
    check_gated_delta_rule_inputs(q, k, v, g, beta)
    return kda_chunked(q, k, v, g.unsqueeze(-1).expand(q.shape), beta, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                       chunk_size=chunk_size, decays=decays)
