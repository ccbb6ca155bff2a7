"""Law 11: non-causal attention is invariant to permuting keys with values; lse matches the truth
and a row that sees no key gets o = 0 and lse = -inf. (A causal row never depending on later keys
is law 2, test_causality.py, which runs attention with causal=True.)"""
import pytest


@pytest.mark.law("key_permutation")
def test_key_permutation(impl, check_law):
    check_law(impl)


@pytest.mark.law("rows_without_keys")
def test_rows_without_keys(impl, check_law):
    check_law(impl)
