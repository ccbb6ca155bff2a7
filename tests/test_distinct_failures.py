"""One failure must not hide another: a law reports each distinct failure (by signature: the first output
over budget and its dtype, ``refcheck.engine.laws.violation``) with its own minimal example, as
Hypothesis' multiple-bug reporting does by failure type. An attention whose bf16 output is wrong and
whose fp32 lse is wrong is shown both ways, not shrunk to whichever the search met first."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import settings

from refcheck import references
from refcheck.engine.laws import LawViolation, hypothesis_check, violation
from refcheck.model import registry
from refcheck.strategies import profiles


def two_bugs(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """BUG twice over: o scaled by 1.5 for bf16 inputs, lse doubled for fp32 inputs."""
    o, lse = references.attention(q.double(), k.double(), v.double(), causal=causal, scale=scale,
                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    if q.dtype == torch.bfloat16:
        o = o * 1.5
    if q.dtype == torch.float32:
        lse = lse * 2
    return o.to(q.dtype), lse.float()


def test_each_signature_is_its_own_violation_type():
    assert violation("") is LawViolation
    assert violation("outputs bf16") is violation("outputs bf16") and issubclass(violation("outputs bf16"), LawViolation)
    assert violation("outputs bf16") is not violation("outputs fp32") and violation("outputs fp32").signature == "outputs fp32"


def test_two_failures_are_each_shrunk_to_their_own_example():
    impl = dataclasses.replace(registry.get("attention", "naive"), name="two_bugs",
                               target="tests.test_distinct_failures:two_bugs", backward=False)
    with pytest.raises(LawViolation) as caught:
        hypothesis_check("agreement", impl, settings=settings(**profiles.PROFILES["ci"]))
    message = str(caught.value)
    assert "2 distinct failures" in message, message
    cases = re.findall(r"^\[\d/2\] law agreement \(1\) violated.*\n  case: attention (\w+)", message, re.M)
    assert sorted(cases) == ["bf16", "fp32"], message
    assert message.count("reproduce: python -c") == 2, message


def test_the_first_failure_only_when_asked():
    """``multiple=False`` (pytest -x, fuzz -x): one failure, shrunk, no search for others."""
    impl = dataclasses.replace(registry.get("attention", "naive"), name="two_bugs",
                               target="tests.test_distinct_failures:two_bugs", backward=False)
    with pytest.raises(LawViolation) as caught:
        hypothesis_check("agreement", impl, settings=settings(**profiles.PROFILES["ci"]), multiple=False)
    message = str(caught.value)
    assert "distinct failures" not in message and message.count("reproduce: python -c") == 1, message


@pytest.mark.parametrize("exitfirst", [False, True], ids=["every failure", "-x"])
def test_the_plugin_reports_every_distinct_failure_unless_x(exitfirst):
    """pytest's law test shows both failures of ``two_bugs``; under ``-x`` (maxfail 1) the first only. The
    ``dev`` profile, seeded: the ``ci`` profile's boundary examples come first, and an explicit example that
    fails ends Hypothesis' run before it searches for another failure. ``-rN``: no short summary, which repeats
    the message (in full where ``CI`` is set)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "refcheck.properties", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-q", "-rN", "-k", "agreement", "--forward-only", "--hypothesis-profile", "dev",
                           "--hypothesis-seed", "3",
                           "--impl", "attention=tests.test_distinct_failures:two_bugs", *(["-x"] if exitfirst else [])],
                          cwd=root, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert ("2 distinct failures" in out) != exitfirst, out
    assert out.count("reproduce: python -c") == (1 if exitfirst else 2), out
