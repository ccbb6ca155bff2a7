"""Law 14: a call with grouped heads (attention's GQA, gated_delta_rule's grouped value heads) equals the
call with each shared head repeated for every head of its group; the shared inputs' gradients are the
repeated ones' summed over each group."""
import pytest


@pytest.mark.law("grouped_heads")
def test_grouped_heads(impl, check_law):
    check_law(impl)
