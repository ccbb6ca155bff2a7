"""Helpers the GPU benchmarks share (``kda.py``, ``gla.py``): errors against float64, the roofline
measured in the same run, medians of CUDA timings."""
from __future__ import annotations

import torch


def rel(x, ref) -> float:
    """``||x - ref|| / ||ref||`` in float64."""
    ref = ref.detach().double()
    return float((x.detach().double() - ref).norm() / ref.norm().clamp_min(1e-300))


def roofline():
    """This GPU's bf16 matmul rate (TFLOP/s, 8192^3) and device copy rate (GB/s, read + write of 1 GiB)."""
    from triton.testing import do_bench
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, return_mode="median")
    src = torch.empty(2 ** 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms_copy = do_bench(lambda: dst.copy_(src), return_mode="median")
    return dict(bf16_tflops=2 * n ** 3 / ms / 1e9, copy_gbps=2 * src.numel() / ms_copy / 1e6)
