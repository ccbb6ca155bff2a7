"""Law 7: the knob combinations that meet every pair of knob values (gather or not, recompute or not, ...;
``laws.path_knobs``) and every autotune config (interpreted) compute what the default path computes,
within budget."""
import pytest


@pytest.mark.law("path_agreement")
def test_path_agreement(impl, check_law):
    check_law(impl)
