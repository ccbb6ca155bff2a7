"""Law 15: decoding token by token (a prefill, then one-token calls each from the state the previous one
returned) equals one call over every token: outputs, final state and gradients."""
import pytest


@pytest.mark.law("decode_equals_prefill")
def test_decode_equals_prefill(impl, check_law):
    check_law(impl)
