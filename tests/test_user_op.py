"""A kernel author's own op (``examples/my_prefix_sum``), registered from their folder with
``--op-card``: every law that its traits admit runs on it, a correct kernel passes, a buggy one
fails with a reproducer that reproduces in a fresh process. Run in subprocesses: registering the op
here would add it to this process's ops."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "my_prefix_sum"
OPTIONS = ["--op-card", "prefix_sum_op:CARD", "--budgets", "budgets.toml"]


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("REFCHECK_OP_CARDS", "PYTEST_XDIST_WORKER")}
    return subprocess.run(args, cwd=EXAMPLE, capture_output=True, text=True, timeout=timeout, env=env)


def _laws(impl: str) -> subprocess.CompletedProcess:
    return _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                "--pyargs", "refcheck.properties", *OPTIONS, "--impl", f"prefix_sum={impl}")


def test_a_correct_kernel_of_a_users_op_passes_every_law_its_traits_admit():
    result = _laws("mykernels:prefix_sum")
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"\b8 passed\b", result.stdout), result.stdout[-2000:]   # laws 1, 2, 3 (x2), 5, 6, 12, 18


@pytest.mark.parametrize("command", ["report", "fuzz"])
def test_the_commands_take_a_users_op(command):
    if command == "report":
        result = _run(sys.executable, "-m", "refcheck", "report", *OPTIONS, "--op", "prefix_sum",
                      "--impl", "prefix_sum=mykernels:prefix_sum")
        assert result.returncode == 0 and "PASS" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    else:
        result = _run(sys.executable, "-m", "refcheck", "fuzz", "prefix_sum", *OPTIONS, "--impl",
                      "mykernels:bug_no_reset", "--law", "varlen_equals_separate", "--seconds", "20", "--seed", "0",
                      "--out-dir", str(EXAMPLE))
        for leftover in EXAMPLE.glob("refcheck-repro-*.py"):
            leftover.unlink()
        assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
        line = next(x for x in result.stdout.splitlines() if x.strip().startswith("reproduce:"))
        program, *args = shlex.split(line.strip().removeprefix("reproduce:").strip())
        assert program == "python", line
        again = _run(sys.executable, *args)  # the user's `python`: this environment's, activated or not
        assert again.returncode == 1 and "LawViolation" in again.stderr, again.stderr[-2000:]


def test_a_users_op_without_budgets_is_a_usage_error_naming_them():
    result = _run(sys.executable, "-m", "refcheck", "report", "--op-card", "prefix_sum_op:CARD", "--op", "prefix_sum",
                  "--impl", "prefix_sum=mykernels:prefix_sum")
    assert result.returncode == 2 and "no contract bound for prefix_sum.o.fp32" in result.stderr, result.stderr


def test_an_unknown_card_is_a_usage_error_before_any_kernel_runs():
    result = _run(sys.executable, "-m", "refcheck", "report", "--op-card", "prefix_sum_op:NOPE")
    assert result.returncode == 2 and "--op-card 'prefix_sum_op:NOPE'" in result.stderr, result.stderr
