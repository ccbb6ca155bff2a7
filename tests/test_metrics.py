"""Error measures: relative RMS with a floor, non-finite handling, bitwise comparison."""
import math

import torch

from refcheck.metrics import bitwise_equal, max_abs_diff, rel_rms


def test_rel_rms_is_relative_rms():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    x = ref + torch.tensor([0.03, -0.04], dtype=torch.float64)
    assert math.isclose(rel_rms(x, ref, 1e-6), 0.01, rel_tol=1e-12)


def test_floor_bounds_the_denominator():
    ref = torch.full((4,), 1e-12, dtype=torch.float64)
    assert math.isclose(rel_rms(ref + 1e-9, ref, 1e-6), 1e-3, rel_tol=1e-9)


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
