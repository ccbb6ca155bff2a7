"""``refcheck fuzz``: the float64 reference survives every law, mutants of ``tests/mutants.py`` are
caught with a reproducer that fails on its own, failures are replayed first from the example
database, and bad command lines exit 2 with a message that names the problem."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from refcheck.commands import cli
from refcheck.model.registry import contract_problems
from tests.mutants import MUTANTS


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory (reproducers and the example database land there; fuzz puts it on
    ``sys.path``, restored afterwards)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def fuzz(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["fuzz", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_alone(path, cwd) -> subprocess.CompletedProcess:
    """Run a reproducer in a new Python process, from another folder, with nothing on PYTHONPATH."""
    return subprocess.run([sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def test_the_float64_reference_survives_every_law(workdir, capsys):
    code, out, _ = fuzz(capsys, "attention", "--impl", "tests.fuzz_adapters:attention", "--max-examples", "3",
                        "--seed", "1")
    assert code == 0, out
    assert "no counterexample in" in out
    for law in ("agreement", "causality", "varlen_equals_separate", "key_permutation", "rows_without_keys"):
        assert law in out
    assert not list(workdir.glob("refcheck-repro-*.py"))


def test_the_float64_reference_survives_the_state_laws(workdir, capsys):
    code, out, _ = fuzz(capsys, "kda", "--impl", "tests.fuzz_adapters:kda", "--max-examples", "3", "--seed", "2",
                        "--law", "causality,varlen_equals_separate,state_chaining,fp16_gates")
    assert code == 0, out
    assert "no counterexample in" in out and "(4 laws," in out


@pytest.mark.parametrize("op, spec, law", [
    ("kda_gate", "tests.mutants:gate_overshoots_lower_bound", "gate_bounds"),          # a record
    ("kda", "tests.mutants:kda_state_leaks_across_sequences", "varlen_equals_separate"),  # a record
    ("gla", MUTANTS["gla_batch_gate_stride"].impl.target, "batch_invariance"),          # a plain callable
])
def test_a_mutant_is_caught_with_a_reproducer_that_fails_alone(workdir, capsys, op, spec, law):
    # -x: one failure, shrunk (test_distinct_failures.py shrinks several)
    code, out, _ = fuzz(capsys, op, "--impl", spec, "--law", law, "--max-examples", "10", "--seed", "0", "-x")
    assert code == 1, out
    assert f"law {law} (" in out and "falsified after" in out
    assert "  case: " in out and "  inputs: " in out              # the minimal example, with shapes and dtypes
    repro = workdir / f"refcheck-repro-{op}-{law}.py"
    assert f"reproducer: {repro.name}" in out
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    done = run_alone(repro, elsewhere)
    assert done.returncode != 0
    assert "LawViolation" in done.stderr and f"law {law}" in done.stderr, done.stderr[-2000:]


def saved(folder) -> bool:
    """Whether an example database folder holds any entry."""
    return folder.is_dir() and any(folder.iterdir())


RARE = ("kda_gate", "--impl", "tests.mutants:gate_wrong_at_some_lengths", "--law", "gate_bounds", "--max-examples", "50")
"""A campaign whose kernel passes Hypothesis's first example and fails a third of the others."""


def test_a_failure_is_replayed_first_by_the_next_run(workdir, capsys):
    code, out, _ = fuzz(capsys, *RARE)
    assert code == 1 and "falsified after 1 example " not in out, out     # found by searching
    assert saved(workdir / ".hypothesis" / "refcheck-fuzz")
    code, out, _ = fuzz(capsys, *RARE)
    assert code == 1 and "falsified after 1 example " in out, out         # replayed from the database


def test_a_seeded_campaign_keeps_no_example_database(workdir, capsys):
    """``--seed`` repeats a search exactly: as Hypothesis' ``@seed``, it neither replays nor saves examples."""
    assert fuzz(capsys, *RARE, "--seed", "3")[0] == 1
    assert not saved(workdir / ".hypothesis" / "refcheck-fuzz")


def test_the_budget_and_the_measured_error_are_printed(workdir, capsys):
    code, out, _ = fuzz(capsys, "kda_gate", "--impl", "tests.mutants:gate_overshoots_lower_bound",
                        "--law", "agreement", "--max-examples", "10", "--seed", "0")
    assert code == 1
    assert re.search(r"gate +error [0-9.e+-]+ +bound [0-9.e+-]+ +FAIL +bound = [0-9.]+ x the fp32 naive error "
                     r"on this case .*\[kda_gate\.gate\.fp32\]", out), out


@pytest.fixture
def user_module(workdir):
    """A module of the user's kernels in the working directory (imported as ``python -m`` would)."""
    name = f"user_kernels_{uuid.uuid4().hex[:8]}"
    (workdir / f"{name}.py").write_text(textwrap.dedent("""
        from refcheck.model import naive

        def explodes(g, A_log, dt_bias=None, lower_bound=None):
            raise RuntimeError("kernel exploded")

        def no_beta(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
            pass

        def swapped(q, k, v, beta, g, **options):
            pass

        def needs_workspace(q, k, v, g, workspace, **options):
            pass

        def with_precision(q, k, v, g, *, precision="ieee", **options):
            return naive.gla(q, k, v, g, **options)

        not_callable = 3
    """))
    return name


def test_an_exception_on_valid_input_is_a_failure_with_its_traceback(user_module, workdir, capsys):
    code, out, _ = fuzz(capsys, "kda_gate", "--impl", f"{user_module}:explodes", "--law", "agreement",
                        "--max-examples", "5", "--seed", "0")
    assert code == 1
    assert "raised RuntimeError on valid input: kernel exploded" in out
    assert "Traceback" in out and f"{user_module}.py" in out
    done = run_alone(workdir / "refcheck-repro-kda_gate-agreement.py", workdir)
    assert done.returncode != 0 and "kernel exploded" in done.stderr


@pytest.mark.parametrize("op, spec, message", [
    ("kdaa", "refcheck.model.naive:kda", "unknown op 'kdaa'"),
    ("kda", "no_such_module:kda", "cannot import module 'no_such_module'"),
    ("kda", "refcheck.model.naive:nope", "has no attribute 'nope'"),
    ("kda", "refcheck.model.naive", "no implementation 'refcheck.model.naive' of kda"),
    ("kda", "tests.mutants:gla_batch_gate_stride", "an implementation of gla, not of kda"),
    ("kda", "USER:no_beta", "missing argument 'beta'"),
    ("kda", "USER:swapped", "argument 4 is 'beta' where the contract passes 'g'"),
    ("gla", "USER:needs_workspace", "extra required argument 'workspace'"),
    ("gla", "USER:not_callable", "not a callable"),
])
def test_usage_errors_exit_2_and_say_why(user_module, capsys, op, spec, message):
    code, out, err = fuzz(capsys, op, "--impl", spec.replace("USER", user_module))
    assert code == 2, out + err
    assert message in err, err


@pytest.mark.parametrize("gpus", ["0", "two", "-1"])
def test_gpus_takes_a_positive_count_or_all(capsys, gpus):
    code, _, err = fuzz(capsys, "kda_gate", "--impl", "naive", "--gpus", gpus)
    assert code == 2 and "--gpus: expected a positive count or 'all'" in err, err


def test_a_mode_the_callable_does_not_take_is_a_usage_error(user_module, capsys):
    code, _, err = fuzz(capsys, "kda_gate", "--impl", "tests.fuzz_adapters:kda_gate", "--precision", "tf32")
    assert code == 2 and "offers ieee" in err
    code, _, err = fuzz(capsys, "gla", "--impl", f"{user_module}:with_precision", "--precision", "tf32x3",
                        "--law", "nope")
    assert code == 2 and "unknown law 'nope'" in err        # tf32x3 passed: the callable takes `precision`


def test_seconds_bound_the_search(workdir, capsys):
    started = time.monotonic()
    code, out, _ = fuzz(capsys, "kda_gate", "--impl", "naive", "--seconds", "2", "--max-examples", "100000",
                        "--law", "gate_bounds,gate_monotone")
    assert code == 0, out
    assert "no counterexample in" in out
    assert time.monotonic() - started < 20


def test_contract_problems_accept_kwargs_and_knobs():
    def fits(q, k, v, g, beta, *, precision="ieee", **options):
        pass

    def positional_only_option(q, k, v, g, beta, scale, /, **options):
        pass

    assert contract_problems(fits, "kda", ["precision"]) == []
    assert contract_problems(fits, "kda", ["use_gather"]) == []            # **options takes it
    assert any("'scale'" in p for p in contract_problems(positional_only_option, "kda"))


def test_a_search_that_kills_its_worker_is_a_crash_and_the_campaign_goes_on(tmp_path):
    """On a GPU each law searches in a worker process of its own (``--gpus``): a kernel that ends its
    process ends one law's search, reported as a crash; the other laws' searches finish."""
    from rich.console import Console

    from refcheck.commands.fuzz import search_in_workers
    from refcheck.engine import laws
    from refcheck.model import registry
    from tests.mutants import gate_kills_its_process

    chosen = [laws.law("agreement"), laws.law("gate_bounds")]
    common = dict(max_examples=3, database=str(tmp_path), device="cpu", mode=None, seconds=None, strict=False,
                  seed=0, buckets=(), jobs=2, console=Console(quiet=True))
    crashed = search_in_workers(gate_kills_its_process, chosen, **common)
    assert [r.status for r in crashed] == ["CRASHED", "CRASHED"]
    assert all("exit status 70" in (r.crash or "") for r in crashed)
    [naive] = registry.resolve("naive", "kda_gate")
    held = search_in_workers(naive, chosen, **common)
    assert [r.status for r in held] == ["holds", "holds"] and all(r.examples >= 3 for r in held)


def test_a_law_broken_in_the_warm_up_is_a_finding():
    """What a compile warm-up's example found stands when the law's search missed it (or had no time)."""
    from refcheck.commands.fuzz import LawResult
    from refcheck.engine import laws

    missed = LawResult(laws.law("agreement"), warm_up="law agreement (1) violated: ...")
    crashed = LawResult(laws.law("agreement"), warm_up="crashed: the worker process running it died (exit status 70)")
    assert missed.found and missed.status == "FALSIFIED in warm-up"
    assert crashed.found and crashed.status == "CRASHED in warm-up"
    assert not LawResult(laws.law("agreement"), examples=3).found


def test_a_campaign_that_tests_nothing_is_never_green(workdir, capsys):
    """Seconds too few for any example: exit status 3 (NOTHING_TESTED), not 0."""
    from refcheck.commands.fuzz import NOTHING_TESTED
    code, out, _ = fuzz(capsys, "kda_gate", "--impl", "naive", "--seconds", "1e-9", "--law", "gate_bounds")
    assert code == NOTHING_TESTED, out
    assert "not run for lack of time" in out and "tested nothing" in out


def test_a_shared_example_database_replays_a_failure_found_on_another_host(tmp_path, monkeypatch, capsys):
    """Issue 18: two campaigns in different working directories ("hosts") that name one
    ``REFCHECK_EXAMPLE_DB``: what the first found by searching, the second replays first, and neither
    keeps a database of its own."""
    from refcheck.strategies.profiles import EXAMPLE_DB_ENV
    shared, hosts = tmp_path / "shared", [tmp_path / "host-a", tmp_path / "host-b"]
    for folder in (shared, *hosts):
        folder.mkdir()
    monkeypatch.setenv(EXAMPLE_DB_ENV, str(shared))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(hosts[0])
    code, out, _ = fuzz(capsys, *RARE)
    assert code == 1 and "falsified after 1 example " not in out, out
    monkeypatch.chdir(hosts[1])
    code, out, _ = fuzz(capsys, *RARE)
    assert code == 1 and "falsified after 1 example " in out, out
    assert saved(shared) and not any(saved(h / ".hypothesis" / "refcheck-fuzz") for h in hosts)


def test_exitfirst_stops_at_the_first_failure(workdir, capsys):
    """-x: the first falsified law keeps one failure (no search for distinct ones) and the laws after
    it are named as not searched; without it, the same search goes on to every law."""
    common = ("kda_gate", "--impl", "tests.mutants:gate_overshoots_lower_bound", "--seed", "0", "--max-examples", "10")
    code, everything, _ = fuzz(capsys, *common)
    # agreement, gate_bounds, inputs_rewritten (law 18 compares with the truth too)
    assert code == 1 and "3 of 8 laws falsified" in everything and "distinct failure 2 of" in everything
    code, first, _ = fuzz(capsys, *common, "-x")
    assert code == 1 and "1 of 1 law falsified" in first and "distinct failure" not in first, first
    assert "stopped at the first failure (--exitfirst), not searched: gate_bounds, " in first
    assert "reproducer: refcheck-repro-kda_gate-agreement.py" in first and "gate_bounds.py" not in first
