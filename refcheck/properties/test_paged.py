"""Laws 20 and 21, a paged KV cache: the pages moved in the pool (block table renumbered, unoccupied rows NaN)
give the same outputs; Tq queries in one call equal each query alone with the cache up to its token."""
import pytest


@pytest.mark.law("pages_shuffled")
def test_pages_shuffled(impl, check_law):
    check_law(impl)


@pytest.mark.law("queries_one_at_a_time")
def test_queries_one_at_a_time(impl, check_law):
    check_law(impl)
