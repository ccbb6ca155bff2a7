"""Public ``paged_attention``: the contract signature of ``references.paged_attention`` plus the knobs
``precision`` (fp32 dots) and ``splits`` (key ranges per sequence), input checks once, then the split-K
decode kernel and its combine (``decode.py``). Forward only: a decode step has no backward.

The checks are the contract's own (``references.paged_attention.check_paged_inputs``: the block table and
the lengths checked on their device, one boolean read back, a synchronization per call) plus what the kernel
needs: q and the caches of one dtype among fp32/bf16/fp16 on one device, head dims up to 576.
"""
from __future__ import annotations

import torch

from refcheck.references.contract import check_scale
from refcheck.references.paged_attention import check_paged_inputs

from ..common import check_precision, check_runs_on
from .decode import decode, split_kernel

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 576
DEFAULT_PRECISION = "tf32"
SPLITS = (None, 1, 3)
"""The ``splits`` knob's values, the default (planned for the GPU) first."""


def paged_attention(q, k_cache, v_cache, block_table, seqused_k, *, scale=None, precision=DEFAULT_PRECISION,
                    splits=None):
    """Decode attention over a paged KV cache (``references.paged_attention``): returns ``(o [N, Tq, H, Dv],
    lse [N, H, Tq] float32)``. ``precision``: the fp32 dots' input precision; ``splits``: key ranges per
    sequence (None: enough to fill the GPU; ``decode.plan_splits``)."""
    check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k)
    scale = check_scale(scale, q.shape[-1])
    precision = check_precision(precision)
    if q.dtype not in KERNEL_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q, k_cache, v_cache: expected one dtype among fp32, bf16, fp16, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    if max(q.shape[-1], v_cache.shape[-1]) > MAX_HEAD_DIM:
        raise ValueError(f"q, v_cache: head dims up to {MAX_HEAD_DIM}, got {q.shape[-1]} and {v_cache.shape[-1]}")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits: expected None or a positive int, got {splits!r}")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("seqused_k", seqused_k)):
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, q on {q.device}")
    check_runs_on("q", q, split_kernel)
    k_cache, v_cache = (x if x.stride(-1) == 1 else x.contiguous() for x in (k_cache, v_cache))
    return decode(q.contiguous(), k_cache, v_cache, block_table, seqused_k, scale, precision, splits)



