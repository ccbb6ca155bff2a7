"""Laws 9 and 10: fp16 gates compute what g.float() computes; the kda gate lies in
[lower_bound, 0] (or (-inf, 0]) and is non-increasing in g."""
import pytest


@pytest.mark.law("fp16_gates")
def test_fp16_gates(impl, check_law):
    check_law(impl)


@pytest.mark.law("gate_bounds")
def test_gate_bounds(impl, check_law):
    check_law(impl)


@pytest.mark.law("gate_monotone")
def test_gate_monotone(impl, check_law):
    check_law(impl)
