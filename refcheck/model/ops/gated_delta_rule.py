"""The record of ``gated_delta_rule`` (Gated DeltaNet: the delta rule with one scalar decay per head
and step, as in Qwen3-Next).

Math, shapes and options: ``references/gated_delta_rule.py`` (float64 truth, recurrent and
chunked; KDA with the decay broadcast over K). Budgets: ``[gated_delta_rule.*]`` in
``tolerances.toml``. Laws: every law whose traits the record has (varlen, state, causal,
decay_gate), ``refcheck/engine/laws.py``.
"""
from __future__ import annotations

from hypothesis import strategies as st

from refcheck import references

from ..implementation import Implementation
from .card import Inputs
from .linear import GATE_IN_KERNEL, gate_in_kernel_draws, gate_parameters, linear_card, linear_tensors


def make_inputs(case, device) -> Inputs:
    """q, k ``[B, T, H, K]`` (k unit-norm unless l2norm is asked), v ``[B, T, HV, V]``, g and beta
    ``[B, T, HV]`` (``HV`` value heads, ``H`` unless the case has grouped value heads); with
    use_gate_in_kernel g raw, then A_log and dt_bias ``[HV]`` too."""
    opts = dict(case.opts)
    tensors, gen = linear_tensors(case, device, gate_shape=lambda b, t, h, k: (b, t, h), with_beta=True,
                                  raw_gate=bool(opts.get("use_gate_in_kernel")))
    if opts.get("use_gate_in_kernel"):
        tensors.update(gate_parameters(case, gen, device, 1))
    return Inputs(tensors, ("q", "k", "v", "g", "beta"), opts)


def options(draw, pick, k, gate_dtype, declined):
    """l2norm of q and k (from K = 2 on: with K = 1, q / ||q|| is +-1 and its gradient only the 1e-6
    epsilon's artifact), the gate in the kernel (a raw gate, A_log, dt_bias or not) unless declined."""
    opts = {"use_qk_l2norm": pick("use_qk_l2norm", st.booleans() if k > 1 else st.just(False))}
    if GATE_IN_KERNEL.name in declined:
        return opts, {}, None
    opts["use_gate_in_kernel"] = pick("use_gate_in_kernel", st.booleans())
    return opts, gate_in_kernel_draws(pick, gate_dtype) if opts["use_gate_in_kernel"] else {}, None


# --- peers: flash-linear-attention 0.6.0, renamed arguments only ---------------------------------

def fla_chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None,
                               dt_bias=None):
    """flash-linear-attention ``chunk_gated_delta_rule``."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel,
                                  A_log=A_log, dt_bias=dt_bias)


def fla_recurrent_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                                   cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None,
                                   dt_bias=None):
    """flash-linear-attention ``fused_recurrent_gated_delta_rule`` (forward only: its backward raises
    NotImplementedError)."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm,
                                            use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)


CARD = linear_card(
    "gated_delta_rule", reference=references.gated_delta_rule,
    chunked_reference=references.gated_delta_rule_chunked,
    differentiable=("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"), make_inputs=make_inputs,
    options=options, shared_inputs=("A_log", "dt_bias"), extensions=(GATE_IN_KERNEL,),
    grid_varlen_options={"use_qk_l2norm": True},
    # grouped value heads (Qwen3-Next, Qwen3.5: 16 query/key heads, 32 value heads): 1, 2 or 4 per query/key head,
    # and a grid case with two value heads per query/key head, one token past a chunk
    value_groups=(1, 2, 4), grid_extra=(("gva", 65, {"use_qk_l2norm": True}, {"HV": 4}),
                                        ("gate_in_kernel", 40, {"use_gate_in_kernel": True}, {"HV": 4})),
    implementations=(
        Implementation("gated_delta_rule", "fla_chunk",
                       "refcheck.model.ops.gated_delta_rule:fla_chunk_gated_delta_rule", triton=True, requires="fla",
                       fixed_mode="tf32", family="fla",
                       backward_refusal="refcheck.model.ops.linear:fla_gated_chunk_backward_refusal",
                       description="flash-linear-attention chunk_gated_delta_rule"),
        Implementation("gated_delta_rule", "fla_recurrent",
                       "refcheck.model.ops.gated_delta_rule:fla_recurrent_gated_delta_rule", triton=True,
                       requires="fla", backward=False, family="fla",
                       description="flash-linear-attention fused_recurrent_gated_delta_rule (no backward)"),
    ))
