"""Gated linear attention (GLA) and its scalar-decay special case (simple GLA).

Per sequence and head, with the state ``S`` of shape ``[K, V]``:

    gla:         S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T      g_t [K]
    simple_gla:  S_t = exp(g_t) S_{t-1} + k_t v_t^T            g_t scalar (one decay per head)
    both:        o_t = scale * S_t^T q_t

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H, K]`` (gla) or ``[B, T, H]``
(simple_gla); states ``[N, H, K, V]`` (N: the number of sequences, B unless packed). simple_gla is
gla with g broadcast over K.

``gla`` / ``simple_gla`` walk the recurrence step by step; ``gla_chunked`` / ``simple_gla_chunked``
evaluate the same math in chunks (``chunk.chunk_scan``, writing ``u_t = v_t``).
"""
from __future__ import annotations

import torch

from .chunk import PairDecays, check_chunk_size, chunk_scan
from .contract import check_linear_qkv, check_scale, check_shape, check_tensor
from .recurrence import scan


def check_gla_inputs(q, k, v, g, *, scalar_gate: bool):
    """Validate the gla / simple_gla contract (shared by every implementation); return (B, T, H, K, V)."""
    b, t, h, kd, vd = check_linear_qkv(q, k, v)
    if scalar_gate:
        check_tensor("g", g, 3)
        check_shape("g", g, (b, t, h), "[B, T, H]")
    else:
        check_tensor("g", g, 4)
        check_shape("g", g, q.shape, "[B, T, H, K] like q")
    return b, t, h, kd, vd


def gla_operands(q, k, v, g, *, scale):
    """Check the gla inputs; return ``(q, k, v, g, scale, K, V)`` with the tensors in ``q.dtype``."""
    *_, kd, vd = check_gla_inputs(q, k, v, g, scalar_gate=False)
    scale = check_scale(scale, kd)
    q, k, v, g = (x.to(q.dtype) for x in (q, k, v, g))
    return q, k, v, g, scale, kd, vd


def gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """GLA by its recurrence, evaluated in ``q.dtype`` (float64 for the truth).

    Returns ``(o [B, T, H, V], final_state [N, H, K, V] or None)``, computed in ``q.dtype``. A kernel's
    dtypes are the contract's: o in the input dtype, final_state in float32.
    """
    q, k, v, g, scale, kd, vd = gla_operands(q, k, v, g, scale=scale)

    def step(state, x):
        state = state * torch.exp(x["g"]).unsqueeze(-1) + x["k"].unsqueeze(-1) * x["v"].unsqueeze(-2)
        return state, scale * torch.einsum("hkv,hk->hv", state, x["q"])

    return scan(step, dict(q=q, k=k, v=v, g=g), kd, vd, initial_state, output_final_state, cu_seqlens)


def simple_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """simple GLA: ``gla`` with the per-head decay ``g [B, T, H]`` broadcast over K.

    Returns ``(o [B, T, H, V], final_state [N, H, K, V] or None)``, computed in ``q.dtype``. A kernel's
    dtypes are the contract's: o in the input dtype, final_state in float32.
    """
    check_gla_inputs(q, k, v, g, scalar_gate=True)
    return gla(q, k, v, g.unsqueeze(-1).expand(q.shape), scale=scale, initial_state=initial_state,
               output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def write_values(x: dict[str, torch.Tensor], G: torch.Tensor, decays: PairDecays) -> tuple[torch.Tensor, None]:
    """GLA writes ``u_t = v_t``: ``Wv = V``, ``Wk = 0`` in every chunk (see ``chunk.chunk_scan``)."""
    return x["v"], None


def gla_chunked(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                chunk_size=64, decays="stable"):
    """GLA in chunks of ``chunk_size`` steps (``chunk.chunk_scan`` writing ``u_t = v_t``): same
    contract and result as ``gla`` (to rounding); ``chunk_size`` is any positive int; ``decays``
    how the in-chunk decays are formed (``chunk.DECAY_FORMS``: ``stable`` for the truth,
    ``differenced`` as kernels form them).

    Returns ``(o [B, T, H, V], final_state [N, H, K, V] or None)``, computed in ``q.dtype``. A kernel's
    dtypes are the contract's: o in the input dtype, final_state in float32.
    """
    chunk_size = check_chunk_size(chunk_size)
    q, k, v, g, scale, kd, vd = gla_operands(q, k, v, g, scale=scale)
    return chunk_scan(dict(q=q, k=k, v=v, g=g), write_values, scale, kd, vd, initial_state,
                      output_final_state, cu_seqlens, chunk_size, decays)


def simple_gla_chunked(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                       cu_seqlens=None, chunk_size=64, decays="stable"):
    """simple GLA in chunks: ``gla_chunked`` with the per-head decay ``g [B, T, H]`` broadcast over K."""
    check_gla_inputs(q, k, v, g, scalar_gate=True)
    return gla_chunked(q, k, v, g.unsqueeze(-1).expand(q.shape), scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
                       decays=decays)
