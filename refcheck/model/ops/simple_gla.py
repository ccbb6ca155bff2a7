"""The record of ``simple_gla`` (gated linear attention with one scalar decay per head and step, the
Mamba-2 form).

Math, shapes and options: ``references/gla.py`` (float64 truth, recurrent and chunked). Our kernels:
``optimized/gla/`` (knobs as gla's). Budgets: ``[simple_gla.*]`` in ``tolerances.toml``. Laws: every
law whose traits the record has (varlen, state, causal, decay_gate), ``refcheck/engine/laws.py``.
"""
from __future__ import annotations

from refcheck import references

from ..implementation import Implementation
from .card import Inputs
from .gla import TRITON_KNOBS
from .linear import linear_card, linear_tensors


def make_inputs(case, device) -> Inputs:
    """q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g ``[B, T, H]``."""
    tensors, _ = linear_tensors(case, device, gate_shape=lambda b, t, h, k: (b, t, h), with_beta=False)
    return Inputs(tensors, ("q", "k", "v", "g"), case.opts)


# --- peers: flash-linear-attention 0.6.0, renamed arguments only ---------------------------------

def fla_chunk_simple_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """flash-linear-attention ``chunk_simple_gla``."""
    from fla.ops.simple_gla import chunk_simple_gla
    return chunk_simple_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fla_recurrent_simple_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None):
    """flash-linear-attention ``fused_recurrent_simple_gla``."""
    from fla.ops.simple_gla import fused_recurrent_simple_gla
    return fused_recurrent_simple_gla(q, k, v, g=g, scale=scale, initial_state=initial_state,
                                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)


CARD = linear_card(
    "simple_gla", reference=references.simple_gla, chunked_reference=references.simple_gla_chunked,
    differentiable=("q", "k", "v", "g", "initial_state"), make_inputs=make_inputs,
    implementations=(
        Implementation("simple_gla", "triton", "refcheck.optimized:simple_gla", knobs=TRITON_KNOBS, triton=True, head_first=True,
                       description="our chunked Triton simple GLA (chunk 64 or 128)"),
        # its backward asserts even K and V in 16-bit ("Triton miscompiles masked K-tail iterations", fla-core 0.6.0)
        Implementation("simple_gla", "fla_chunk", "refcheck.model.ops.simple_gla:fla_chunk_simple_gla", triton=True,
                       requires="fla", fixed_mode="tf32", family="fla", dim_multiple={"bf16": 2, "fp16": 2},
                       backward_refusal="refcheck.model.ops.linear:fla_gated_chunk_backward_refusal",
                       description="flash-linear-attention chunk_simple_gla"),
        Implementation("simple_gla", "fla_recurrent", "refcheck.model.ops.simple_gla:fla_recurrent_simple_gla",
                       triton=True, requires="fla", family="fla",
                       description="flash-linear-attention fused_recurrent_simple_gla"),
    ))
