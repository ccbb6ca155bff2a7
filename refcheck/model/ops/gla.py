"""The record of ``gla`` (gated linear attention: a decay per key channel).

Math, shapes and options: ``references/gla.py`` (float64 truth, recurrent and chunked). Our kernels:
``optimized/gla/`` (also simple_gla's). Budgets: ``[gla.*]`` in ``tolerances.toml``. Laws: every law
whose traits the record has (varlen, state, causal, decay_gate), ``refcheck/engine/laws.py``.
"""
from __future__ import annotations

from refcheck import references

from ..case import PRECISION_MODES
from ..implementation import Implementation
from .card import Inputs
from .linear import linear_card, linear_tensors

# knobs of our Triton kernels (gla and simple_gla): fp32 dot precision, tokens per chunk, state passes split
# by K-block or not (their default, None, picks by the grid: split at the sizes the laws draw, so both are named)
TRITON_KNOBS = {"precision": PRECISION_MODES, "chunk_size": (64, 128), "split_k": (True, False)}


def make_inputs(case, device) -> Inputs:
    """q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``."""
    tensors, _ = linear_tensors(case, device, gate_shape=lambda b, t, h, k: (b, t, h, k), with_beta=False)
    return Inputs(tensors, ("q", "k", "v", "g"), case.opts)


# --- peers: flash-linear-attention 0.6.0, renamed arguments only ---------------------------------

def fla_chunk_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """flash-linear-attention ``chunk_gla``."""
    from fla.ops.gla import chunk_gla
    return chunk_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fla_recurrent_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """flash-linear-attention ``fused_recurrent_gla`` (the per-key gate is its ``gk``)."""
    from fla.ops.gla import fused_recurrent_gla
    return fused_recurrent_gla(q, k, v, gk=g, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens)


CARD = linear_card(
    "gla", reference=references.gla, chunked_reference=references.gla_chunked,
    differentiable=("q", "k", "v", "g", "initial_state"), make_inputs=make_inputs,
    implementations=(
        Implementation("gla", "triton", "refcheck.optimized:gla", knobs=TRITON_KNOBS, triton=True, head_first=True,
                       description="our chunked Triton GLA (chunk 64 or 128)"),
        # V >= 16: its backward's chunk_gla_bwd_kernel_dA takes a dot over BV = next_power_of_2(V) values,
        # which the compiler refuses below 16 (CompilationError "... K >= 16" on an H100, triton 3.6; the
        # faithful interpreter refuses it too); chunk_gla does not check V (benchmarks/results/gpu_findings_h100.sh)
        Implementation("gla", "fla_chunk", "refcheck.model.ops.gla:fla_chunk_gla", triton=True, requires="fla",
                       fixed_mode="tf32", family="fla", min_dims={"V": 16}, description="flash-linear-attention chunk_gla"),
        Implementation("gla", "fla_recurrent", "refcheck.model.ops.gla:fla_recurrent_gla", triton=True,
                       requires="fla", family="fla", description="flash-linear-attention fused_recurrent_gla"),
    ))
