"""The record of ``gated_delta_rule`` (Gated DeltaNet: the delta rule with one scalar decay per head
and step, as in Qwen3-Next).

Math, shapes and options: ``references/gated_delta_rule.py`` (float64 truth, recurrent and
chunked; KDA with the decay broadcast over K). Budgets: ``[gated_delta_rule.*]`` in
``tolerances.toml``. Laws: every law whose traits the record has (varlen, state, causal,
decay_gate), ``refcheck/engine/laws.py``.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from refcheck import references

from ..implementation import Implementation
from .card import Extension, Inputs
from .inputs import normal, rounded
from .kda import TRITON_KNOBS
from .linear import GATE_IN_KERNEL, STATE_POOL, gate_in_kernel_draws, gate_parameters, linear_card, linear_tensors

CHUNK_KNOBS = {name: TRITON_KNOBS[name] for name in ("precision", "segment_chunks")}
"""The chunked kernel's knobs: KDA's that it takes."""


def make_inputs(case, device) -> Inputs:
    """q, k ``[B, T, H, K]`` (k unit-norm unless l2norm is asked), v ``[B, T, HV, V]``, g and beta
    ``[B, T, HV]`` (``HV`` value heads, ``H`` unless the case has grouped value heads); with
    use_gate_in_kernel g raw, then A_log and dt_bias ``[HV]`` too; with use_beta_sigmoid_in_kernel beta as
    logits (N(0, 2^2), rounded to the input dtype); with state_v_first the initial state ``[N, HV, V, K]``."""
    opts = dict(case.opts)
    tensors, gen = linear_tensors(case, device, gate_shape=lambda b, t, h, k: (b, t, h), with_beta=True,
                                  raw_gate=bool(opts.get("use_gate_in_kernel")))
    if opts.get("use_gate_in_kernel"):
        tensors.update(gate_parameters(case, gen, device, 1))
    if opts.get("use_beta_sigmoid_in_kernel"):
        tensors["beta"] = rounded(normal(gen, tensors["beta"].shape, device, 2.0), case.torch_dtype)
    if opts.get("state_v_first") and "initial_state" in tensors:
        tensors["initial_state"] = tensors["initial_state"].transpose(-1, -2).contiguous()
    return Inputs(tensors, ("q", "k", "v", "g", "beta"), opts)


BETA_IN_KERNEL = Extension(
    "beta_in_kernel", ("use_beta_sigmoid_in_kernel", "allow_neg_eigval"),
    "beta given as logits, sigmoid(beta) computed in the kernel (2 sigmoid(beta), in [0, 2), with allow_neg_eigval)")
STATE_V_FIRST = Extension("state_v_first", ("state_v_first",),
                          "states laid out [N, HV, V, K] (value first), initial and final alike")


def options(draw, pick, k, gate_dtype, declined):
    """l2norm of q and k (from K = 2 on: with K = 1, q / ||q|| is +-1 and its gradient only the 1e-6
    epsilon's artifact); unless declined, beta as logits (a third of the time; allow_neg_eigval half of
    those), the state value-first (a third of the time), the gate in the kernel (a raw gate, A_log,
    dt_bias or not). A pinned signature (a compile bucket) has an option exactly where its case had it."""
    opts = {"use_qk_l2norm": pick("use_qk_l2norm", st.booleans() if k > 1 else st.just(False))}
    if BETA_IN_KERNEL.name not in declined and pick("use_beta_sigmoid_in_kernel", st.sampled_from([False, False, True]),
                                                     absent=False):
        opts["use_beta_sigmoid_in_kernel"] = True
        opts["allow_neg_eigval"] = pick("allow_neg_eigval", st.booleans())
    if STATE_V_FIRST.name not in declined and pick("state_v_first", st.sampled_from([False, False, True]), absent=False):
        opts["state_v_first"] = True
    if GATE_IN_KERNEL.name in declined:
        return opts, {}, None
    opts["use_gate_in_kernel"] = pick("use_gate_in_kernel", st.booleans())
    return opts, gate_in_kernel_draws(pick, gate_dtype) if opts["use_gate_in_kernel"] else {}, None


# --- peers: flash-linear-attention 0.6.0, renamed arguments only ---------------------------------

def fla_chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None,
                               dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                               state_v_first=False):
    """flash-linear-attention ``chunk_gated_delta_rule``."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel,
                                  A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                  allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first)


def fla_recurrent_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                                   cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None,
                                   dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                   state_v_first=False):
    """flash-linear-attention ``fused_recurrent_gated_delta_rule`` (forward only: its backward raises
    NotImplementedError)."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm,
                                            use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
                                            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                            allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first)


def flashinfer_chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                                      cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None,
                                      dt_bias=None, state_v_first=False):
    """FlashInfer's GDN prefill (``flashinfer.gdn_prefill.chunk_gated_delta_rule``, a CuTe DSL kernel on SM90):
    packed ``[total, heads, 128]`` (a batch becomes B sequences of T), the gate as log-decay
    (``gate_domain="log"``) or computed from A_log and dt_bias in the call, fp32 gates and beta, states in its
    own ``[N, HV, V, K]`` layout (``state_v_first``; transposed otherwise). It declines beta as logits: its
    ``beta_is_logit`` rounds the sigmoid to beta's dtype and has no ``allow_neg_eigval``."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule
    b, t, h, kd = q.shape
    hv, vd = v.shape[2], v.shape[3]
    cu = (torch.arange(b + 1, dtype=torch.int32, device=q.device) * t if cu_seqlens is None
          else cu_seqlens.to(torch.int32))
    gate: dict = dict(gate_domain="log")
    if use_gate_in_kernel:
        gate = dict(use_gate_in_kernel=True, A_log=A_log.float().contiguous(),
                    dt_bias=(torch.zeros(hv, device=q.device) if dt_bias is None else dt_bias).float().contiguous())
    h0 = None
    if initial_state is not None:
        h0 = (initial_state if state_v_first else initial_state.transpose(-1, -2)).float().contiguous()
    result = chunk_gated_delta_rule(q.reshape(b * t, h, kd).contiguous(), k.reshape(b * t, h, kd).contiguous(),
                                    v.reshape(b * t, hv, vd).contiguous(), g.reshape(b * t, hv).float().contiguous(),
                                    beta.reshape(b * t, hv).float().contiguous(), scale=scale, initial_state=h0,
                                    output_final_state=output_final_state, cu_seqlens=cu,
                                    use_qk_l2norm_in_kernel=use_qk_l2norm, **gate)
    o, final = result if output_final_state else (result, None)
    if final is not None and not state_v_first:
        final = final.transpose(-1, -2).contiguous()
    return o.view(b, t, hv, vd), final


CARD = linear_card(
    "gated_delta_rule", reference=references.gated_delta_rule,
    chunked_reference=references.gated_delta_rule_chunked,
    differentiable=("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"), make_inputs=make_inputs,
    options=options, shared_inputs=("A_log", "dt_bias"), extensions=(GATE_IN_KERNEL, BETA_IN_KERNEL, STATE_V_FIRST, STATE_POOL),
    grid_varlen_options={"use_qk_l2norm": True},
    # grouped value heads (Qwen3-Next, Qwen3.5: 16 query/key heads, 32 value heads): 1, 2 or 4 per query/key head,
    # and a grid case with two value heads per query/key head, one token past a chunk
    value_groups=(1, 2, 4), grid_extra=(("gva", 65, {"use_qk_l2norm": True}, {"HV": 4}),
                                        ("gate_in_kernel", 40, {"use_gate_in_kernel": True}, {"HV": 4}),
                                        ("beta_logits_v_first", 40, {"use_beta_sigmoid_in_kernel": True,
                                                                     "allow_neg_eigval": True, "state_v_first": True}),
                                        # Qwen3.5's layer: 16 query/key heads, 32 value heads of 128 (GPU only: interpreted,
                                        # its 32 heads of 128 x 128 states cost minutes per implementation)
                                        ("qwen35_heads", 65, {"use_qk_l2norm": True}, {"H": 16, "HV": 32, "K": 128, "V": 128},
                                         {"devices": ("cuda",)})),
    implementations=(
        Implementation("gated_delta_rule", "triton", "refcheck.optimized:gated_delta_rule_chunk", knobs=CHUNK_KNOBS,
                       triton=True, description="our chunked Triton GDN (KDA's kernels, one decay per value head)"),
        Implementation("gated_delta_rule", "triton_recurrent", "refcheck.optimized:gated_delta_rule_recurrent",
                       triton=True, backward=False,
                       description="our Triton recurrent kernel (decode over a state pool, GVA, gate and beta in the kernel)"),
        Implementation("gated_delta_rule", "fla_chunk",
                       "refcheck.model.ops.gated_delta_rule:fla_chunk_gated_delta_rule", triton=True, requires="fla",
                       fixed_mode="tf32", family="fla",
                       backward_refusal="refcheck.model.ops.linear:fla_gated_chunk_backward_refusal",
                       description="flash-linear-attention chunk_gated_delta_rule"),
        # flashinfer-python 0.7.4 on SM90: K = V = 128 only, fp16/bf16 inputs (delta_rule_sm90.py)
        Implementation("gated_delta_rule", "flashinfer",
                       "refcheck.model.ops.gated_delta_rule:flashinfer_chunk_gated_delta_rule", devices=("cuda",),
                       dtypes=("bf16", "fp16"), requires="flashinfer", backward=False, head_dims=(128,),
                       family="flashinfer", description="FlashInfer's GDN prefill (CuTe DSL, Hopper)"),
        Implementation("gated_delta_rule", "fla_recurrent",
                       "refcheck.model.ops.gated_delta_rule:fla_recurrent_gated_delta_rule", triton=True,
                       requires="fla", backward=False, family="fla",
                       description="flash-linear-attention fused_recurrent_gated_delta_rule (no backward)"),
    ))
