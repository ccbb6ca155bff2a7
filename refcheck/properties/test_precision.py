"""Law 8: precision modes are honoured on fp32 inputs: error(ieee) <= error(tf32x3) <= error(tf32)
up to a stated slack, and tf32 is measurably worse than the other two."""
import pytest


@pytest.mark.law("precision_modes")
def test_precision_modes(impl, check_law):
    check_law(impl)
