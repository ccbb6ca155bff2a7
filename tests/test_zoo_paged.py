"""Paged decode of another formula (``tests/zoo/paged.py``: split-K over pages, combined by log-sum-exp) holds
the float64 truth on the grid's cases in every dtype and every law of the op on the ci profile's draws; its
buggy twin (a rescale dropped in the combine) is caught."""
from __future__ import annotations

import pytest
from hypothesis import settings

from refcheck.engine import grid
from refcheck.engine.laws import LAWS, LawViolation, hypothesis_check
from refcheck.engine.verify import verify
from refcheck.model import registry
from refcheck.strategies import profiles

CORRECT = ("split_k_one_page", "split_k_three_pages_p_input")
KNOB_LAWS = ("path_agreement", "precision_modes")
"""Laws about knobs (paths, precision modes) a plain function does not have."""
OP_LAWS = [law.name for law in LAWS.values() if "paged_attention" in law.ops and law.name not in KNOB_LAWS]


def zoo(name: str) -> registry.Implementation:
    return registry.resolve(f"paged_attention=tests.zoo.paged:{name}")[0]


@pytest.fixture(autouse=True)
def _restore_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


def grid_cases() -> list:
    """The grid's cases in every dtype, the GPU-sized ones included (the zoo runs them on the CPU alike)."""
    return [entry.case for entry in grid.cases("paged_attention")]


@pytest.mark.parametrize("name", CORRECT)
def test_correct_members_pass_the_grid(name):
    impl = zoo(name)
    for case in grid_cases():
        verdict = verify(impl, case, grads=False)
        assert verdict.passed, verdict.table()


@pytest.mark.parametrize("law", OP_LAWS)
@pytest.mark.parametrize("name", CORRECT)
def test_correct_members_hold_every_law(name, law):
    hypothesis_check(law, zoo(name), settings=settings(**profiles.PROFILES["ci"]))


def test_the_buggy_twin_is_caught():
    with pytest.raises(LawViolation, match="agreement"):
        hypothesis_check("agreement", zoo("bug_split_k_combined_by_running_max"),
                         settings=settings(**profiles.PROFILES["ci"]))
