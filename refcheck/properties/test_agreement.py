"""Law 1: agreement with the float64 reference within the budgets of tolerances.toml, for outputs,
final states and every gradient the implementation provides (random upstream gradients)."""
import pytest


@pytest.mark.law("agreement")
def test_agreement(impl, check_law):
    check_law(impl)
