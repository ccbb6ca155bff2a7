"""``refcheck drift`` and ``refcheck budgets diff`` end to end.

Records are made by the real command line in subprocesses, with ``tests/degradable_kda.py`` joining
the registry (``--impl kda=degradable_kda:kda``): once plain (twice, to prove records are
deterministic) and once with ``REFCHECK_TEST_DEGRADE=1``, where it rounds fp32 operands to tf32 as a
kernel that silently ignored the precision it was asked for. ``compare`` must flag exactly the fp32
outputs; corrupt, truncated and mismatched records must be refused with a clear message.
"""
from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from refcheck.commands import budget_diff, cli, drift, drift_compare
from refcheck.engine import grid
from refcheck.model.budgets import parse
from refcheck.model.ops import OPS

ROOT = Path(__file__).resolve().parent.parent
IMPL = "degradable_kda:kda"
RECORD_ARGS = ["drift", "record", "--quick", "--op", "kda", "--impl", f"kda={IMPL}"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "REFCHECK_TEST_DEGRADE"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), **extra}


def _record_all(folder: Path) -> None:
    sides = {"base": ("1", {}), "again": ("2", {}), "head": ("1", {"REFCHECK_TEST_DEGRADE": "1"})}
    procs = {name: subprocess.Popen([sys.executable, "-m", "refcheck", *RECORD_ARGS, "--jobs", jobs, "--out",
                                     str(folder / f"{name}.json")], cwd=ROOT, env=_env(**extra),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (jobs, extra) in sides.items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"drift record ({name}) failed:\n{out}\n{err}"
        assert "drift record: done" in err and "9/9" in err, err       # the progress bar was shown


@pytest.fixture(scope="session")
def records(tmp_path_factory, worker_id) -> dict[str, Path]:
    """base, again (the same code once more, in 2 processes) and head (degraded) records of the quick
    kda grid, made once for all xdist workers (the first to get the lock records, the others wait)."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent
    folder = shared / "drift-records"
    with open(shared / "drift-records.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "done").exists():
            folder.mkdir(exist_ok=True)
            _record_all(folder)
            (folder / "done").touch()
    return {name: folder / f"{name}.json" for name in ("base", "again", "head")}


def compare_cli(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["drift", "compare", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- record ----------------------------------------------------------------------------------------

def test_two_records_of_the_same_code_are_identical(records):
    """Also across the number of worker processes (base in 1, again in 2)."""
    assert records["base"].read_bytes() == records["again"].read_bytes()
    assert records["base"].read_bytes() != records["head"].read_bytes()


def test_record_holds_environment_and_grid_points(records):
    rec = drift.load(records["base"])
    env = rec["environment"]
    assert env["device"] == "cpu" and env["interpreted"] is True
    assert {"python", "torch", "triton", "refcheck", "git_revision", "git_dirty", "device_name"} <= set(env)
    assert rec["grid"]["ops"] == ["kda"] and rec["grid"]["quick"] is True and len(rec["grid"]["hash"]) == 64
    ids = [p["id"] for p in rec["points"]]
    assert len(ids) == len(set(ids)) == 9                     # 3 dtypes x (1 base case + 2 sweep lengths)
    dense = next(p for p in rec["points"] if p["id"] == f"kda/{IMPL}/bf16/ieee/dense")
    assert dense["outputs"]["o"]["budget"] == "kda.o.bf16" and 0 < dense["outputs"]["o"]["error"] < 1e-2
    assert dense["crash"] is None and dense["problems"] == []


def test_write_atomic_leaves_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "rec.json"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(drift.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        drift.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["rec.json"]


# --- compare ---------------------------------------------------------------------------------------

def test_degraded_implementation_is_a_regression(records, capsys):
    code, out, _ = compare_cli(capsys, records["base"], records["head"])
    assert code == 1
    result = drift_compare.compare(drift.load(records["base"]), drift.load(records["head"]))
    flagged = {r.point["dtype"] for r in result.regressions}
    assert flagged == {"fp32"}                                # tf32 rounding changes fp32 inputs only
    assert all(r.ratio > 100 for r in result.regressions)
    # dg's and dbeta's fp32 ieee budgets cover gate spikes of -1000 (|G| up to 7e3 within a chunk, see
    # their reasons in tolerances.toml), which leaves room for tf32's error on these small cases: drift
    # flags them by the ratio alone; every other output is over its budget as well
    assert {r.output for r in result.regressions if r.status != "over budget"} <= {"dg", "dbeta"}
    assert sum(r.status == "over budget" for r in result.regressions) >= 3 * 5
    assert len(result.regressions) == 3 * 7 + 1               # dense: 7 outputs + dh0; T=16, 64: 7 each
    assert {r.status for r in result.rows if r.point["dtype"] != "fp32"} == {"unchanged"}
    assert out.index("regressions (22)") < out.index("22 regressions in 66 compared outputs")


def test_same_code_compares_clean(records, capsys):
    code, out, _ = compare_cli(capsys, records["base"], records["again"])
    assert code == 0
    assert "no regressions in 66 compared outputs (66 unchanged)" in out


def test_markdown_and_plots(records, tmp_path, capsys):
    plots = tmp_path / "plots"
    code, out, _ = compare_cli(capsys, records["base"], records["head"], "--markdown", "--plots", plots,
                               "--plots-url", "https://ci.example/run/7")
    assert code == 1
    assert out.startswith("### refcheck drift: :x: 22 regressions")
    assert "#### Regressions (22)" in out and f"| over budget | kda [{IMPL}] fp32 ieee dense | o |" in out
    assert "[kda ieee](https://ci.example/run/7/kda-ieee.png)" in out
    png = plots / "kda-ieee.png"
    assert [p.name for p in plots.iterdir()] == ["kda-ieee.png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 30_000
    from matplotlib.image import imread
    image = imread(png)
    assert image.shape[0] > 500 and image.shape[1] > 800
    assert len({tuple(px) for px in image[::7, ::7, :3].reshape(-1, 3).tolist()}) > 20   # lines, not a blank


def _edited(records, tmp_path, edit) -> Path:
    rec = json.loads(records["base"].read_text())
    edit(rec)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(rec))
    return path


@pytest.mark.parametrize("name, make, message", [
    ("truncated", lambda text: text[: len(text) // 2], "truncated: the JSON ends early"),
    ("corrupt", lambda text: text.replace('"points": [', '"points": [}', 1), "corrupt JSON at line"),
    ("empty", lambda text: "", "empty file"),
    ("foreign", lambda text: '{"hello": 1}', "not a refcheck drift record"),
])
def test_unreadable_records_are_refused(records, tmp_path, capsys, name, make, message):
    bad = tmp_path / f"{name}.json"
    bad.write_text(make(records["base"].read_text()))
    code, _, err = compare_cli(capsys, records["base"], bad)
    assert code == 2 and message in err and str(bad) in err
    with pytest.raises(drift.RecordError, match=message):
        drift.load(bad)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(format_version=0), "format version 0; this refcheck reads version 1"),
    (lambda r: r["grid"].update(hash="0" * 64, quick=False), "different grids .* quick: True vs False"),
    (lambda r: r["grid"].update(hash="0" * 64), "the grid's cases differ"),
    (lambda r: r["environment"].update(device="cuda", interpreted=False), "different devices .* 'cpu' vs 'cuda'"),
    (lambda r: r["points"][0].pop("outputs"), r"malformed drift record: points\[0\] .* 'outputs' missing"),
    (lambda r: r["points"][3]["outputs"]["o"].update(error=[1]), "malformed drift record: expected a number"),
])
def test_mismatched_or_malformed_records_are_refused(records, tmp_path, capsys, edit, message):
    code, _, err = compare_cli(capsys, records["base"], _edited(records, tmp_path, edit))
    assert code == 2
    assert re.search(message, err), err


def test_threshold_is_checked(records, capsys):
    code, _, err = compare_cli(capsys, records["base"], records["again"], "--threshold", "0.9")
    assert code == 2 and "--threshold: expected a finite factor > 1" in err


def test_every_status(records):
    """Synthetic edits of a record: each kind of change gets its status, regressions sort first."""
    base = drift.load(records["base"])
    pid = f"kda/{IMPL}/bf16/ieee/"
    for p in base["points"]:
        if p["id"] == pid + "dense":
            for name in ("dv", "dg"):
                p["outputs"][name]["bound"] = p["outputs"][name]["error"] / 2    # over budget in base
    head = copy.deepcopy(base)
    points = {p["id"]: p for p in head["points"]}
    points[pid + "dense"]["outputs"]["dv"]["error"] *= 1.1                # still failing, not much worse
    points[pid + "dense"]["outputs"]["dg"]["error"] *= 2                  # failing and much worse
    points[pid + "dense"]["outputs"]["o"]["error"] *= 1.3                 # regressed at 1.25, changed at 1.5
    points[pid + "dense"]["outputs"]["dq"]["error"] *= 0.5                # improved
    points[pid + "dense"]["outputs"]["dk"]["bound"] *= 2                  # a loosened budget, same error
    points[pid + "T=16"]["crash"] = "RuntimeError: boom"                  # broken
    points[pid + "T=16"]["outputs"] = {}
    head["points"].remove(points[pid + "T=64"])                           # gone
    extra = copy.deepcopy(points[pid + "dense"])
    extra["id"] = pid + "extra"
    head["points"].append(extra)                                          # new
    result = drift_compare.compare(base, head, 1.25)
    status = {(r.point["id"], r.output): r.status for r in result.rows}
    assert status[(pid + "dense", "o")] == "regressed"
    assert status[(pid + "dense", "dq")] == "improved"
    assert status[(pid + "dense", "dk")] == "unchanged"
    assert status[(pid + "T=16", "*")] == "broken"
    assert status[(pid + "T=64", "*")] == "gone"
    assert status[(pid + "dense", "dv")] == "still failing"
    assert status[(pid + "dense", "dg")] == "regressed"
    assert status[(pid + "extra", "o")] == "new"
    assert [r.status for r in result.rows[:5]] == ["broken", "regressed", "regressed", "gone", "still failing"]
    dk = next(r for r in result.rows if r.point["id"] == pid + "dense" and r.output == "dk")
    assert "(was " in drift_compare._cells(dk)[6]
    looser = drift_compare.compare(base, head, 1.5)
    assert {(r.point["id"], r.output): r.status for r in looser.rows}[(pid + "dense", "o")] == "changed"


# --- grid ------------------------------------------------------------------------------------------

def test_grid_covers_every_op_and_skips_unavailable_implementations():
    full = grid.build("cpu")
    assert {p.case.op for p in full.points} == set(OPS)
    assert len({p.id for p in full.points}) == len(full.points)
    assert ("attention", "fa4", "runs on cuda only") in full.unavailable
    assert all(p.entry.sweep for p in full.points if p.entry.label.startswith("T="))
    # the identity is the definition only: the same with other implementations available
    assert full.hash == grid.grid_hash(grid.identity(list(OPS), None, False))
    assert grid.build("cpu", quick=True).hash != full.hash


def test_grid_rejects_unknown_names():
    with pytest.raises(ValueError, match="impls: nosuch not registered"):
        grid.build("cpu", impls=["nosuch"])
    with pytest.raises(ValueError, match="unknown op 'nosuch'"):
        grid.build("cpu", ops=["nosuch"])


# --- budgets diff ----------------------------------------------------------------------------------

BUDGETS = '''
[kda.o]
bf16 = { metric = "rel_rms", ieee = 2e-2, tf32 = 2e-2, tf32x3 = 2e-2, reason = "naive bf16 measured 5.6e-3" }
fp16 = { metric = "rel_rms", ieee = 2e-3, tf32 = 2e-3, tf32x3 = 2e-3, reason = "naive fp16 measured 7e-4" }
[gla.o]
fp32 = { metric = "rel_rms", ieee = 1e-5, tf32 = 5e-3, tf32x3 = 1e-5, reason = "fp32 accumulation" }
'''
CHANGED = '''
[kda.o]
bf16 = { metric = "rel_rms", ieee = 2e-2, tf32 = 3e-2, tf32x3 = 2e-2, reason = "safe_gate path: tf32 measured 1.2e-2" }
[gla.o.fp32]
metric = "rel_rms"
ieee = 1e-6
tf32 = 5e-3
tf32x3 = 1e-5
reason = "fp32 accumulation"
[gla.o.fp32.triton]
metric = "rel_rms"
ieee = 2e-5
tf32 = 5e-3
tf32x3 = 2e-5
reason = "chunked kernel measured 8e-6"
'''


def _budgets(text: str):
    return parse(text, "t.toml", {name: card.budget_outputs for name, card in OPS.items()})


def test_budget_changes_are_classified_loosened_first():
    changes = budget_diff.diff(_budgets(BUDGETS), _budgets(CHANGED))
    assert [(c.kind, c.key) for c in changes] == [("loosened", "kda.o.bf16"), ("tightened", "gla.o.fp32"),
                                                  ("added", "gla.o.fp32.triton"), ("removed", "kda.o.fp16")]
    assert changes[0].fields == [("tf32", 2e-2, 3e-2)] and changes[0].reason.startswith("safe_gate path")
    assert changes[0].old_reason == "naive bf16 measured 5.6e-3"
    metric = BUDGETS.replace('bf16 = { metric = "rel_rms"', 'bf16 = { metric = "naive_ratio"')
    assert [c.fields for c in budget_diff.diff(_budgets(BUDGETS), _budgets(metric))] == [
        [("metric", "rel_rms", "naive_ratio")]]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                   check=True, capture_output=True)


def test_budgets_diff_between_git_revisions(tmp_path, capsys):
    _git(tmp_path, "init", "-q")
    (tmp_path / "refcheck").mkdir()
    (tmp_path / "refcheck" / "tolerances.toml").write_text(BUDGETS)
    _git(tmp_path, "add", "refcheck/tolerances.toml")
    _git(tmp_path, "commit", "-q", "-m", "base")
    (tmp_path / "refcheck" / "tolerances.toml").write_text(CHANGED)

    assert cli.main(["budgets", "diff", "--repo", str(tmp_path)]) == 0          # HEAD -> working tree
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "budgets diff: refcheck/tolerances.toml HEAD -> working tree"
    sections = [out.index(f"{kind} (1):") for kind in ("loosened", "tightened", "added", "removed")]
    assert sections == sorted(sections)
    assert "  kda.o.bf16: tf32 0.02 -> 0.03 (x1.5)\n      reason: safe_gate path: tf32 measured 1.2e-2\n" in out

    _git(tmp_path, "commit", "-q", "-am", "head")
    code = cli.main(["budgets", "diff", "HEAD~1", "HEAD", "--repo", str(tmp_path), "--markdown", "--fail-on-loosened"])
    out = capsys.readouterr().out
    assert code == 1
    assert "#### loosened (1) :warning:" in out and "| `kda.o.bf16` | tf32 0.02 -> 0.03 (x1.5) |" in out

    assert cli.main(["budgets", "diff", "nosuch", "--repo", str(tmp_path)]) == 2
    assert "git show nosuch:refcheck/tolerances.toml failed" in capsys.readouterr().err
