"""A kda implementation for the drift tests, registered as ``kda=degradable_kda:kda``.

It is the naive implementation; with ``REFCHECK_TEST_DEGRADE=1`` in the environment it first rounds
fp32 q, k and v to tf32 (10 mantissa bits, round to nearest) with a straight-through gradient: what
a kernel that silently uses tf32 where full fp32 was asked computes. bf16 and fp16 inputs already
fit in 10 mantissa bits, so only the fp32 points of a grid change.
"""
from __future__ import annotations

import os

import torch

from refcheck.model import naive

DROPPED_BITS = 23 - 10   # fp32 mantissa bits that tf32 drops


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to 10 mantissa bits; the gradient passes through unchanged."""
    if x.dtype != torch.float32:
        return x
    bits = x.detach().view(torch.int32)
    half = 1 << (DROPPED_BITS - 1)
    rounded = ((bits + half) & ~((1 << DROPPED_BITS) - 1)).view(torch.float32)
    return x + (rounded - x).detach()


def kda(q, k, v, g, beta, **options):
    if os.environ.get("REFCHECK_TEST_DEGRADE") == "1":
        q, k, v = (round_to_tf32(x) for x in (q, k, v))
    return naive.kda(q, k, v, g, beta, **options)
