"""Error measures: relative RMS with a floor, non-finite handling, bitwise comparison."""
import math

import torch

from refcheck.model.metrics import bitwise_equal, max_abs_diff, rel_rms, representable_floor


def test_rel_rms_is_relative_rms():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    x = ref + torch.tensor([0.03, -0.04], dtype=torch.float64)
    assert math.isclose(rel_rms(x, ref, 1e-6), 0.01, rel_tol=1e-12)


def test_floor_bounds_the_denominator():
    ref = torch.full((4,), 1e-12, dtype=torch.float64)
    assert math.isclose(rel_rms(ref + 1e-9, ref, 1e-6), 1e-3, rel_tol=1e-9)


def test_floor_is_at_least_the_smallest_normal_of_the_stored_dtype():
    # kda_gate dg of fp16 gates: true values of 2e-6 stored as fp16 subnormals (spacing 6e-8) are off
    # by ~1e-2 relative from rounding alone; relative to fp16's smallest normal (6.1e-5) they are not.
    ref = torch.tensor([-2.427e-6, 6.95e-8, 2.41e-8], dtype=torch.float64)
    stored = ref.to(torch.float16)
    tiny = torch.finfo(torch.float16).tiny
    assert representable_floor(stored, ref) == tiny
    diff = float((stored.double() - ref).norm()) / math.sqrt(3)
    assert math.isclose(rel_rms(stored, ref, 1e-6), diff / tiny, rel_tol=1e-12)
    assert rel_rms(stored, ref, 1e-6) < 1e-3 < rel_rms(stored.double(), ref, 1e-6)
    # fp32 / bf16 / fp64 reach 1.2e-38 and below: the given floor stays in charge there
    assert representable_floor(torch.zeros(1), torch.zeros(1, dtype=torch.bfloat16)) < 1e-37
    assert representable_floor(torch.zeros(1, dtype=torch.int64)) == 0.0


def test_nan_or_inf_where_reference_finite_fails():
    ref = torch.ones(3, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        assert rel_rms(torch.tensor([1.0, bad, 1.0]), ref, 1e-6) == math.inf


def test_non_finite_reference_entries_must_match_exactly():
    ref = torch.tensor([-math.inf, 1.0], dtype=torch.float64)
    assert rel_rms(torch.tensor([-math.inf, 1.0]), ref, 1e-6) == 0.0
    assert rel_rms(torch.tensor([-1e30, 1.0]), ref, 1e-6) == math.inf


def test_bitwise_and_max_abs_diff():
    a = torch.tensor([0.0, 1.0, float("nan")])
    assert bitwise_equal(a, a.clone()) and max_abs_diff(a, a.clone()) == 0.0
    assert not bitwise_equal(a, torch.tensor([-0.0, 1.0, float("nan")]))
    assert max_abs_diff(a, torch.tensor([0.0, 1.5, float("nan")])) == 0.5
