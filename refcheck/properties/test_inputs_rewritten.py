"""Law 18: new values written into the same input tensors after a call give, on the next call, the float64
truth of the new values (a result cached by pointer or shape, or read from a stale buffer, does not)."""
import pytest


@pytest.mark.law("inputs_rewritten")
def test_inputs_rewritten(impl, check_law):
    check_law(impl)
