"""Law 5: two runs on the same inputs are bitwise identical, forward and backward."""
import pytest


@pytest.mark.law("determinism")
def test_determinism(impl, check_law):
    check_law(impl)
