"""Law 2 (and law 11's causal rows): changing inputs at positions after t leaves the outputs at
positions up to t, and the gradients under upstream gradients that vanish after t, unchanged."""
import pytest


@pytest.mark.law("causality")
def test_causality(impl, check_law):
    check_law(impl)
