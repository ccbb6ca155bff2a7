"""The record of ``kda`` (Kimi Delta Attention: the gated delta rule with a per-channel decay).

Math, shapes and options: ``references/kda.py`` (float64 truth, recurrent and chunked). Our kernels:
``optimized/kda/``. Budgets: ``[kda.*]`` in ``tolerances.toml``. Laws: every law whose traits the
record has (varlen, state, causal, decay_gate), ``refcheck/engine/laws.py``.
"""
from __future__ import annotations

from hypothesis import strategies as st

from refcheck import references

from ...strategies import lower_bounds
from ..case import PRECISION_MODES
from ..implementation import Implementation
from .card import Inputs
from .linear import STATE_POOL, gate_in_kernel_draws, gate_parameters, linear_card, linear_tensors

TRITON_KNOBS = {"precision": PRECISION_MODES, "use_gather": (True, False), "disable_recompute": (False, True),
               "segment_chunks": (None, 1)}


def make_inputs(case, device) -> Inputs:
    """q, k, v, g ``[B, T, H, K]`` (raw with use_gate_in_kernel, then A_log ``[H]`` and dt_bias
    ``[H * K]`` too), beta ``[B, T, H]``."""
    opts = dict(case.opts)
    tensors, gen = linear_tensors(case, device, gate_shape=lambda b, t, h, k: (b, t, h, k), with_beta=True,
                                  raw_gate=bool(opts.get("use_gate_in_kernel")))
    if opts.get("use_gate_in_kernel"):
        tensors.update(gate_parameters(case, gen, device, case.dim["K"]))
    return Inputs(tensors, ("q", "k", "v", "g", "beta"), opts)


def options(draw, pick, k, gate_dtype, declined):
    """l2norm of q and k (from K = 2 on: with K = 1, q / ||q|| is +-1 and its gradient only the 1e-6
    epsilon's artifact), the gate in the kernel (raw gate, A_log, dt_bias or not), safe_gate with a
    lower bound (the log-decays clamped to it)."""
    opts = {"use_qk_l2norm": pick("use_qk_l2norm", st.booleans() if k > 1 else st.just(False))}
    opts["use_gate_in_kernel"] = gate_in_kernel = pick("use_gate_in_kernel", st.booleans())
    opts["safe_gate"] = safe = pick("safe_gate", st.booleans())
    bounded = safe or (gate_in_kernel and draw(st.booleans()))
    opts["lower_bound"] = pick("lower_bound", lower_bounds() if bounded else st.none())
    drawn, clamp = {}, None
    if gate_in_kernel:
        drawn.update(gate_in_kernel_draws(pick, gate_dtype))
    elif safe:
        clamp = opts["lower_bound"]
    return opts, drawn, clamp


# --- peers: flash-linear-attention 0.6.0, renamed arguments only ---------------------------------

def fla_chunk_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                  use_qk_l2norm=False, safe_gate=False, lower_bound=None, use_gate_in_kernel=False, A_log=None,
                  dt_bias=None):
    """flash-linear-attention ``chunk_kda``."""
    from fla.ops.kda import chunk_kda
    return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                     use_qk_l2norm_in_kernel=use_qk_l2norm, safe_gate=safe_gate, lower_bound=lower_bound,
                     use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)


def fla_recurrent_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                      cu_seqlens=None, use_qk_l2norm=False, safe_gate=False, lower_bound=None,
                      use_gate_in_kernel=False, A_log=None, dt_bias=None, ssm_state_indices=None,
                      inplace_final_state=False):
    """flash-linear-attention ``fused_recurrent_kda`` (forward only). ``safe_gate`` promises
    ``lower_bound <= g <= 0``, which the chunked kernels exploit and a recurrence does not need;
    ``lower_bound`` takes part in the gate only when it is computed in the kernel. A decode step over a
    state pool (``ssm_state_indices``) goes to ``fused_recurrent_kda_fwd``, the entry point serving
    engines call (the public function passes no indices); with ``inplace_final_state`` it returns the
    pool as its final state, which the contract leaves out."""
    from fla.ops.kda import fused_recurrent_kda
    if ssm_state_indices is None and not inplace_final_state:
        return fused_recurrent_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale,
                                   initial_state=initial_state, output_final_state=output_final_state,
                                   use_qk_l2norm_in_kernel=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel,
                                   lower_bound=lower_bound if use_gate_in_kernel else None, cu_seqlens=cu_seqlens)
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    # the entry point serving calls has no input_guard: it addresses its inputs as contiguous (law state_pool's
    # one-token views of a batch of two rows read other tokens' values through it)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o, final = fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
                                       scale=scale, output_final_state=output_final_state,
                                       inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
                                       ssm_state_indices=ssm_state_indices, use_qk_l2norm_in_kernel=use_qk_l2norm,
                                       use_gate_in_kernel=use_gate_in_kernel,
                                       lower_bound=lower_bound if use_gate_in_kernel else None)
    return o, None if inplace_final_state else final


CARD = linear_card(
    "kda", reference=references.kda, chunked_reference=references.kda_chunked,
    differentiable=("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"),
    make_inputs=make_inputs, options=options, shared_inputs=("A_log", "dt_bias"), extensions=(STATE_POOL,),
    grid_varlen_options={"use_qk_l2norm": True},
    grid_extra=(("gate_in_kernel", 40, {"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -5.0}),),
    implementations=(
        Implementation("kda", "triton", "refcheck.optimized:kda", knobs=TRITON_KNOBS, triton=True,
                       description="our chunked Triton KDA (chunk 64, WY solve)"),
        Implementation("kda", "fla_chunk", "refcheck.model.ops.kda:fla_chunk_kda", triton=True, requires="fla",
                       fixed_mode="tf32", family="fla", description="flash-linear-attention chunk_kda"),
        Implementation("kda", "fla_recurrent", "refcheck.model.ops.kda:fla_recurrent_kda", triton=True,
                       requires="fla", backward=False, family="fla",
                       description="flash-linear-attention fused_recurrent_kda (no backward)"),
    ))
