"""Laws 16 and 17, of attention's extensions: the keys a query does not see (its sliding window, the causal
diagonal, other packed sequences) do not change its output or gradients; a sink of -inf is no sink."""
import pytest


@pytest.mark.law("window_locality")
def test_window_locality(impl, check_law):
    check_law(impl)


@pytest.mark.law("sinks_neutral")
def test_sinks_neutral(impl, check_law):
    check_law(impl)
