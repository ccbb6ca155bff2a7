"""Error measures: the only place in refcheck where an error is computed.

All measures are taken in float64 against the float64 reference ``ref``:

* ``rel_rms(x, ref, floor) = rms(x - ref) / max(rms(ref), floor)`` where ``rms(y) = ||y|| / sqrt(n)``.
  The floor keeps a tensor whose reference is ~0 (a gradient that vanishes, a state fully decayed)
  from turning rounding noise into a huge relative error. The floor is at least the smallest normal
  number of the dtypes of ``x`` and ``ref`` (``representable_floor``): below it a dtype has no
  relative precision left (fp16 subnormals are spaced 6e-8 apart, so a gradient of 2e-6 stored in
  fp16 is off by 1e-2 relative from rounding alone), so relative error there says nothing.
* Non-finite reference entries (``lse = -inf`` for a row that sees no key) must be matched exactly
  and are left out of the RMS; a non-finite ``x`` where ``ref`` is finite makes the error ``inf``:
  NaN or Inf where the reference is finite always fails.
"""
from __future__ import annotations

import math

import torch

METRICS = ("rel_rms", "naive_ratio")
"""Metric names a budget may use. ``naive_ratio`` measures ``rel_rms`` too, but bounds it by a
multiple of the error of the naive implementation (the reference evaluated in the input dtype)."""


def representable_floor(*tensors: torch.Tensor) -> float:
    """The smallest normal number of the coarsest floating dtype among ``tensors`` (6.1e-5 for fp16,
    1.2e-38 for fp32 and bf16; 0 without a floating tensor)."""
    return max((torch.finfo(t.dtype).tiny for t in tensors if t.is_floating_point()), default=0.0)


def rel_rms(x: torch.Tensor, ref: torch.Tensor, floor: float) -> float:
    """Relative RMS error of ``x`` against ``ref`` (same shape), ``inf`` on a non-finite mismatch;
    the denominator is at least ``max(floor, representable_floor(x, ref))``."""
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"shape mismatch: got {tuple(x.shape)}, reference {tuple(ref.shape)}")
    floor = max(floor, representable_floor(x, ref))
    x, ref = x.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)
    finite = torch.isfinite(ref)
    if not bool(torch.isfinite(x[finite]).all()):
        return math.inf
    special = ~finite
    if bool(special.any()) and not bool((x[special] == ref[special]).all() or
                                        (x[special].isnan() & ref[special].isnan()).all()):
        return math.inf
    n = int(finite.sum())
    if n == 0:
        return 0.0
    diff, truth = (x - ref)[finite], ref[finite]
    rms_diff = float(diff.norm()) / math.sqrt(n)
    rms_ref = float(truth.norm()) / math.sqrt(n)
    return rms_diff / max(rms_ref, floor)


def rel_rms_denominator(x: torch.Tensor, ref: torch.Tensor, floor: float) -> float:
    """What ``rel_rms(x, ref, floor)`` divides by: ``max(rms(ref), floor, representable_floor)``
    over the finite entries of ``ref``: turns an absolute RMS allowance into a relative one."""
    ref = ref.detach().to("cpu", torch.float64)
    truth = ref[torch.isfinite(ref)]
    rms_ref = float(truth.norm()) / math.sqrt(truth.numel()) if truth.numel() else 0.0
    return max(rms_ref, floor, representable_floor(x, ref))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest elementwise difference; 0 for bitwise-equal tensors (NaN equal to NaN)."""
    a, b = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    same = (a == b) | (a.isnan() & b.isnan())
    if bool(same.all()):
        return 0.0
    return float((a - b)[~same].abs().nan_to_num(math.inf).max())


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.view(width), b.view(width)))
