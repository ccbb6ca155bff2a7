"""Law 4: running [0, t) then [t, T) with the carried final state equals one run over [0, T)."""
import pytest


@pytest.mark.law("state_chaining")
def test_state_chaining(impl, check_law):
    check_law(impl)
