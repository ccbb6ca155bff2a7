"""Law 6: inputs are unchanged after forward and backward; no output or gradient element is left
unwritten (fresh allocations are NaN-poisoned) or non-finite where the float64 truth is finite."""
import pytest


@pytest.mark.law("no_side_effects")
def test_no_side_effects(impl, check_law):
    check_law(impl)
