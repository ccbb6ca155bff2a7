"""Law 13: an implementation that offers the head-first layout (``head_first=True``, tensors
``[B, H, T, ...]``) computes, on the transposed inputs, bit for bit its sequence-first result transposed."""
import pytest


@pytest.mark.law("head_first")
def test_head_first(impl, check_law):
    check_law(impl)
