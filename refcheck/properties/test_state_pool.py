"""Law 19: a decode step over a state pool (each sequence's state read from its slot, written back in
place) gives the same step given the states directly; every other slot and input is untouched."""
import pytest


@pytest.mark.law("state_pool")
def test_state_pool(impl, check_law):
    check_law(impl)
