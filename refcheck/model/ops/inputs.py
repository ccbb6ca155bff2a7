"""Drawing an op's tensors from a case: the pieces every op record's ``make_inputs`` shares.

Values are drawn in float32 from the case's seeded generator and rounded to the case's dtype (the
values an implementation sees, which the float64 truth reproduces exactly).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..case import Case


def normal(gen: torch.Generator, shape, device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device)


def rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to ``dtype``: the values an implementation sees and the truth reproduces."""
    return x.to(dtype)


def draw_log_decay(gen: torch.Generator, shape, device, draw: dict) -> torch.Tensor:
    """Log-decays ``g <= 0``: ``logsigmoid(N(0,1)) / normalizer``, zeroed with probability
    ``mask_p``, a fraction ``spike_p`` of entries pushed to ``-U(0, spike)`` (very strong decay),
    and clamped to ``[lower_bound, 0]`` when ``clamp`` is given (safe_gate)."""
    g = F.logsigmoid(torch.randn(shape, generator=gen)) / float(draw.get("normalizer", 1.0))
    mask_p = float(draw.get("mask_p", 0.0))
    if mask_p:
        g = torch.where(torch.rand(shape, generator=gen) < mask_p, 0.0, g)
    spike_p = float(draw.get("spike_p", 0.0))
    if spike_p:
        spikes = -torch.rand(shape, generator=gen) * float(draw.get("spike", 1000.0))
        g = torch.where(torch.rand(shape, generator=gen) < spike_p, spikes, g)
    if draw.get("clamp") is not None:
        g = g.clamp(float(draw["clamp"]), 0.0)
    return g.to(device)


def cu_seqlens(case: Case, lengths, device) -> torch.Tensor:
    """The offsets of packed sequences of ``lengths``, in the case's cu_seqlens dtype."""
    dtype = torch.int32 if case.drawn.get("cu_dtype", "int32") == "int32" else torch.int64
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return torch.tensor(bounds, dtype=dtype, device=device)
