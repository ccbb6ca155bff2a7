"""Law 3: packed sequences (cu_seqlens) and batch rows each get what they get when run alone."""
import pytest


@pytest.mark.law("varlen_equals_separate")
def test_varlen_equals_separate(impl, check_law):
    check_law(impl)


@pytest.mark.law("batch_invariance")
def test_batch_invariance(impl, check_law):
    check_law(impl)
