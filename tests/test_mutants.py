"""Every law can fail: each mutant of ``tests/mutants.py`` is killed by the laws it targets within
the ci profile's example budget (shrinking off: the kill is what counts), the correct controls
survive every law that concerns them, and a failure shrinks to a small example whose printed
reproducer fails on its own."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from refcheck.engine.laws import LAWS, LawViolation, hypothesis_check
from refcheck.strategies import profiles
from tests.gaming import HACKS
from tests.mutants import CONTROLS, MUTANTS

ROOT = Path(__file__).resolve().parent.parent
CI = profiles.PROFILES["ci"]
NO_SHRINK = settings(**{**CI, "phases": (Phase.explicit, Phase.generate)})
"""The ci profile without shrinking: the same examples the ci run draws, stopped at the first kill."""


def test_every_law_has_two_mutants():
    """Each law kills at least two deliberately broken implementations: the mutants here, or the gaming
    kernels of ``tests/gaming.py`` (``tests/test_gaming.py`` shows each caught by its law)."""
    counts = Counter(law for m in MUTANTS.values() for law in m.kills)
    counts.update(h.caught_by for h in HACKS.values())
    assert {law: counts[law] for law in LAWS if counts[law] < 2} == {}
    assert set(counts) <= set(LAWS)


@pytest.mark.parametrize("name, law", [(n, law) for n, m in MUTANTS.items() for law in m.kills],
                         ids=[f"{n}-{law}" for n, m in MUTANTS.items() for law in m.kills])
def test_mutant_is_killed(name, law):
    with pytest.raises(LawViolation, match=f"law {law} .*violated") as caught:
        hypothesis_check(law, MUTANTS[name].impl, settings=NO_SHRINK)
    assert "reproduce: python -c" in str(caught.value)
    assert "on valid input" not in str(caught.value), "killed by a crash of the mutant, not by the law"


@pytest.mark.parametrize("name, law", [(n, law.name) for n, impl in CONTROLS.items()
                                       for law in LAWS.values() if not law.why_not(impl)],
                         ids=[f"{n}-{law.name}" for n, impl in CONTROLS.items()
                              for law in LAWS.values() if not law.why_not(impl)])
def test_control_survives(name, law):
    hypothesis_check(law, CONTROLS[name], settings=settings(**CI))


def test_failure_shrinks_to_a_reproducer_that_fails_alone():
    """The off-by-one gate of kda breaks causality: shrunk to a tiny case (one head, at most three
    tokens: with a zero initial state the first decay is invisible, so two tokens may not show it),
    and the printed one-line reproducer fails the same way in a new process. fp32 cases only: each dtype's
    failure is a distinct one (``laws.violation``), shrunk apart, and one is what this test is about."""
    import dataclasses
    fp32 = dataclasses.replace(MUTANTS["kda_future_gate"].impl, dtypes=("fp32",))
    with pytest.raises(LawViolation) as caught:
        hypothesis_check("causality", fp32, settings=settings(**CI))
    message = str(caught.value)
    commands = re.findall(r'reproduce: python -c "(.*)"$', message, re.M)
    found = [(eval(re.search(r"Case\.make\('kda', (\{[^}]*\})", c).group(1)), c) for c in commands]
    dims, command = min(found, key=lambda f: (f[0]["T"], f[0]["H"], f[0]["B"]))
    assert dims["T"] <= 3 and dims["H"] == 1 and dims["B"] == 1, message
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "LawViolation" in done.stderr and "law causality" in done.stderr, done.stderr
