"""``refcheck list`` piped: one implementation a line, nothing cut, greppable; ``--op`` filters and
``--json`` parses."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from refcheck.model import registry

LIST = [sys.executable, "-m", "refcheck", "list", "--device", "cpu"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LIST, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def piped() -> list[list[str]]:
    done = run()
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines() if not line.startswith("#")]


def test_piped_lines_are_plain_and_uncut(piped):
    lines = subprocess.run(f"{shlex.join(LIST)} | grep gated_delta_rule", shell=True, capture_output=True, text=True,
                           timeout=300).stdout.splitlines()
    assert lines and all(line.startswith("gated_delta_rule\t") for line in lines)
    assert not any("…" in cell or "..." in cell for row in piped for cell in row)
    assert all(len(row) == 6 for row in piped)
    listed = {(row[0], row[1]) for row in piped}
    assert {(i.op, i.name) for i in registry.implementations("gated_delta_rule")} <= listed


def test_json_parses_and_op_filters():
    done = run("--json", "--op", "attention")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["implementations"]
    assert rows and {r["op"] for r in rows} == {"attention"}
    assert {"impl", "dtypes", "knobs", "backward", "available", "why_not"} <= set(rows[0])
    plain = run("--op", "attention")
    ops = {line.split("\t")[0] for line in plain.stdout.splitlines() if not line.startswith("#")}
    assert ops == {"attention"}


def test_an_unknown_op_is_a_usage_error():
    done = run("--op", "atention")
    assert done.returncode == 2 and "--op atention: unknown op" in done.stderr
