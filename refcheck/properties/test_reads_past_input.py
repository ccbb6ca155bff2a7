"""Law 12: inputs handed over as views into larger buffers, poisoned (NaN, +-1e30, 2**30 in
cu_seqlens) before, after and between their rows (strided views), and before and after them (contiguous
views, as a wrapper that makes inputs contiguous passes them on), give the outputs and gradients of
plain inputs."""
import pytest


@pytest.mark.law("reads_past_input")
def test_reads_past_input(impl, check_law):
    check_law(impl)
