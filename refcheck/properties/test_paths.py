"""Law 7: every knob combination (gather or not, recompute or not, ...) and every autotune config
(interpreted) computes what the default path computes, within budget."""
import pytest


@pytest.mark.law("path_agreement")
def test_path_agreement(impl, check_law):
    check_law(impl)
