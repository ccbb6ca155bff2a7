"""``refcheck report``: the error table and the law summary on a reduced selection, valid JSON,
exit 1 on a broken implementation (with its reproducer), unavailable implementations listed and
not failed, usage errors exit 2; which fixed grid case each law runs on."""
from __future__ import annotations

import json
import os

import pytest

from refcheck.commands import cli
from refcheck.engine import grid
from refcheck.engine.examples import meets
from refcheck.engine.laws import LAWS, fixed_params
from refcheck.model import registry
from refcheck.model.case import Case
from tests.mutants import MUTANTS


def report(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["report", "--device", "cpu", "--quick", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def own_registry(monkeypatch):
    """Implementations registered by a test stay in that test."""
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


def test_report_prints_the_tables_and_writes_json(tmp_path, capsys):
    path = tmp_path / "report.json"
    code, out, _ = report(capsys, "--op", "kda_gate,attention", "--impl", "naive", "--impl", "sdpa",
                          "--jobs", "1", "--json", str(path))
    assert code == 0, out
    assert "kda_gate: worst error / budget, headroom" in out and "attention: worst error / budget" in out
    assert "laws on fixed grid cases" in out and "11 gate_bounds" in out and "PASS" in out
    data = json.loads(path.read_text())
    assert data["format"] == "refcheck-report" and data["passed"] is True
    assert {(p["op"], p["impl"]) for p in data["points"]} == {("kda_gate", "naive"), ("attention", "naive"),
                                                               ("attention", "sdpa")}
    assert data["unavailable"] == []
    gate = next(p for p in data["points"] if p["op"] == "kda_gate" and p["dtype"] == "bf16")
    m = gate["outputs"]["gate"]
    assert m["passed"] and m["error"] <= m["bound"] and m["budget"] == "kda_gate.gate.bf16"
    assert "naive error on this case" in m["made_of"]
    statuses = {(r["law"], r["op"], r["impl"]): r["status"] for r in data["laws"]}
    assert statuses[("gate_bounds", "kda_gate", "naive")] == "holds"
    assert statuses[("path_agreement", "attention", "sdpa")] == "n/a"
    assert data["summary"]["points"] == len(data["points"]) and data["summary"]["laws_failed"] == 0


def test_a_broken_implementation_fails_the_report(tmp_path, capsys, own_registry):
    broken = "attention=" + MUTANTS["attention_top_left_causal"].impl.target
    code, out, _ = report(capsys, "--op", "attention", "--impl", broken, "--json", str(tmp_path / "r.json"))
    assert code == 1
    assert "FAIL" in out and "reproduce: python -c" in out
    assert "law agreement FAILS" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] is False and data["summary"]["points_failed"] > 0


def test_worker_processes_give_the_same_verdicts(capsys):
    code, out, _ = report(capsys, "--op", "kda_gate", "--impl", "naive", "--jobs", "2")
    assert code == 0, out
    assert "with 2 workers" in out and "PASS" in out


@pytest.mark.parametrize("args, message", [
    (("--op", "kdaa"), "unknown op"),
    (("--impl", "nope"), "no implementation 'nope'"),
    (("--impl", "fa4"), "attention/fa4 cannot run on cpu"),        # a named peer that cannot run: no skip
    (("--impl", "attention=no_such_module:attention"), "cannot import module 'no_such_module'"),
    (("--op", "simple_gla", "--dtype", "fp64"), "simple_gla has no such inputs"),
    (("--budgets", "no_such_file.toml"), "no such file"),
    (("--jobs", "0"), "--jobs"),
])
def test_usage_errors_exit_2(capsys, args, message):
    code, _, err = report(capsys, "--no-laws", *args)
    assert code == 2 and message in err, err


def test_each_law_runs_on_a_grid_case_that_meets_its_requirements():
    entries = {(e.case.op, e.label, e.case.dtype): e.case for op in ("kda", "attention") for e in grid.cases(op)}
    dense, varlen = entries[("kda", "dense", "fp32")], entries[("kda", "varlen", "fp32")]
    assert meets(dense, LAWS["batch_invariance"].requires) and not meets(varlen, LAWS["batch_invariance"].requires)
    assert meets(varlen, LAWS["varlen_equals_separate"].requires)
    assert not meets(dense, LAWS["fp16_gates"].requires) and meets(entries[("kda", "dense", "fp16")],
                                                                    LAWS["fp16_gates"].requires)
    assert meets(entries[("attention", "varlen", "fp32")], LAWS["key_permutation"].requires)
    causal_short_keys = Case.make("attention", dict(B=1, T=8, S=5, H=1, Hk=1, Dqk=4, Dv=4), "fp32", 0,
                                  options={"causal": True})
    assert meets(causal_short_keys, LAWS["rows_without_keys"].requires)
    assert not meets(causal_short_keys.replace(dims=dict(causal_short_keys.dim, S=8)), LAWS["rows_without_keys"].requires)
    with pytest.raises(ValueError, match="unknown"):
        meets(dense, {"min_widgets": 2})


def test_law_parameters_are_fixed_mid_sequence():
    case = Case.make("kda", dict(B=1, T=70, H=1, K=4, V=4), "fp32", 0)
    assert fixed_params(LAWS["causality"], case) == {"cut": 34}
    assert fixed_params(LAWS["state_chaining"], case) == {"split": 35}
    assert fixed_params(LAWS["path_agreement"], case) == {}


def test_an_implementation_that_kills_its_process_is_a_finding_and_the_report_goes_on(tmp_path, capsys,
                                                                                      own_registry, monkeypatch):
    (tmp_path / "crashy.py").write_text(
        "import os\n\n"
        "def attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):\n"
        "    os.abort()   # as an illegal memory access or a device-side assert ends a GPU process\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    code, out, _ = report(capsys, "--op", "attention", "--impl", "naive,attention=crashy:attention",
                          "--dtype", "fp32", "--quick", "--no-laws", "--jobs", "2")
    assert code == 1, out
    assert "the worker process running it died (killed by signal 6)" in out
    assert "FAIL attention/crashy:attention/fp32" in out and "reproduce: python -c" in out
    assert "FAIL attention/naive/" not in out                          # the others were measured
