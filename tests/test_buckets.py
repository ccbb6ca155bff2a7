"""Compile buckets (refcheck.engine.buckets): a GPU run's examples stay in the specializations compiled
before the first example, every law still gets examples it admits, and the plan is reproducible."""
import pytest
from hypothesis import given, settings
from rich.console import Console

from refcheck.engine import buckets
from refcheck.engine.examples import Bucket, cases, examples, signature
from refcheck.engine.laws import LAWS
from refcheck.model import registry
from refcheck.strategies import LARGE, SMALL

IMPLS = [("kda", "naive"), ("kda", "triton"), ("gla", "naive_chunked"), ("attention", "sdpa"), ("kda_gate", "naive")]


@pytest.mark.parametrize("op,name", IMPLS)
def test_plan_is_reproducible_and_admits_every_law(op, name):
    impl = registry.get(op, name)
    planned = buckets.plan(impl, LARGE, seed=11)
    assert planned == buckets.plan(impl, LARGE, seed=11)
    assert len(set(planned)) == len(planned)
    for law in LAWS.values():
        if law.why_not(impl) is None:
            assert any(b.admits(law.requires) for b in planned), law.name
    # the buckets of one implementation share head counts and dims where their laws allow
    shapes = {tuple((k, v) for k, v in b.pinned if k in ("H", "K", "V", "Hk", "Dqk", "Dv")) for b in planned}
    assert len(shapes) == 1


def test_seeds_choose_different_buckets():
    impl = registry.get("kda", "naive")
    assert len({buckets.plan(impl, LARGE, seed=s) for s in range(6)}) > 1


@pytest.mark.parametrize("op", ["kda", "gla", "simple_gla", "kda_gate", "attention", "gated_delta_rule"])
@settings(max_examples=25, deadline=None, database=None)
@given(data=__import__("hypothesis").strategies.data())
def test_pinned_signature_round_trips(op, data):
    """A case drawn with another case's signature pinned has that signature, whatever else is drawn."""
    case = data.draw(cases(op, None, SMALL))
    again = data.draw(cases(op, None, SMALL, pinned=dict(signature(case))))
    assert signature(again) == signature(case)


CONSTRAINED = ("agreement", "varlen_equals_separate", "batch_invariance", "fp16_gates", "precision_modes",
               "rows_without_keys")
"""Laws that require what a bucket pins (packed or not, a gate dtype, fp32 inputs, causal)."""


@pytest.mark.parametrize("op,name,law_name", [
    (op, name, law) for op, name in IMPLS for law in CONSTRAINED if LAWS[law].why_not(registry.get(op, name)) is None])
def test_examples_stay_in_their_buckets(op, name, law_name):
    impl, law = registry.get(op, name), LAWS[law_name]
    planned = buckets.plan(impl, LARGE, seed=3)
    allowed = {(b.pinned, b.mode, b.knobs) for b in planned if b.admits(law.requires)}
    seen = set()

    @settings(max_examples=15, deadline=None, database=None)
    @given(examples(law, impl, SMALL, buckets=planned))
    def check(example):
        key = (signature(example.case), example.mode, tuple(sorted(example.knobs.items())))
        assert key in allowed
        seen.add(key)
    check()
    assert seen


def test_no_admitting_bucket_is_a_clear_error():
    impl, law = registry.get("kda", "naive"), LAWS["varlen_equals_separate"]
    only = Bucket(tuple(sorted({"dtype": "fp32", "packed": False}.items())), "ieee")
    with pytest.raises(ValueError, match="none of the 1 compile buckets of kda/naive admits"):
        buckets._draw(examples(law, impl, SMALL, buckets=(only,)), 0, simplest=True)


def test_warm_up_runs_every_applicable_law_on_small_examples():
    impl = registry.get("kda_gate", "naive")
    planned = buckets.plan(impl, LARGE, seed=5)
    jobs = buckets.warm_ups(impl, planned, seed=5)
    applicable = {law.name for law in LAWS.values() if law.why_not(impl) is None}
    assert {j.law for j in jobs} == applicable
    assert all(j.example.case.dim["T"] >= buckets.WARM_LENGTHS[0] for j in jobs)
    took = buckets.warm_up(jobs, "cpu", 1, Console(quiet=True))
    assert took["runs"] == len(jobs) and took["raised"] == 0


def test_run_seed_is_inherited_through_the_environment(monkeypatch):
    monkeypatch.delenv(buckets.SEED_ENV, raising=False)
    first = buckets.run_seed()
    assert buckets.run_seed() == first            # a later process reads the same seed
    assert buckets.run_seed(42) == 42 and buckets.run_seed() == 42


def test_warm_up_reports_what_its_examples_find():
    """A warm-up is a law's check on a drawn example: a law it breaks, or a process it kills, is a
    finding (``failed``), which ``refcheck fuzz`` and the pytest plugin report even where the law's
    own search never meets the example again (on the H100 a 25 s fuzz campaign spent its time in the
    warm-up, whose examples all crashed, and printed "no counterexample")."""
    from tests.mutants import gate_kills_its_process, gate_sigmoid_unscaled

    planned = buckets.plan(gate_sigmoid_unscaled, LARGE, seed=5)
    jobs = [j for j in buckets.warm_ups(gate_sigmoid_unscaled, planned, seed=5) if j.law in ("gate_bounds", "determinism")]
    took = buckets.warm_up(jobs, "cpu", 1, Console(quiet=True))
    failed = took["failed"]
    assert set(failed) == {("gate_bounds", "kda_gate", gate_sigmoid_unscaled.name)}
    assert "law gate_bounds (10) violated" in failed["gate_bounds", "kda_gate", gate_sigmoid_unscaled.name]

    holds = next(j for j in jobs if j.law == "determinism")
    odd = [j for j in buckets.warm_ups(gate_kills_its_process, planned, seed=5)
           if j.law == "agreement" and j.example.case.dim["T"] % 2]
    assert odd, "no warm-up at an odd length"
    took = buckets.warm_up([odd[0], holds], "cpu", 2, Console(quiet=True))   # in 2 worker processes
    [(key, what)] = took["failed"].items()
    assert key == ("agreement", "kda_gate", gate_kills_its_process.name)
    assert what.startswith("crashed: ") and "exit status 70" in what


def test_a_warm_up_finding_fails_the_pytest_run(tmp_path):
    """Through the pytest plugin: the warm-up (``--warm-up`` on the CPU) runs every law once per bucket,
    gate_bounds among them, which the mutant breaks; the only test selected (determinism) passes,
    and the run still fails, listing the warm-up's finding and writing it to REFCHECK_FAILURE_DIR."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "pytest", str(root / "refcheck" / "properties"), "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-q", "-o", "addopts=", "--hypothesis-profile", "gpu", "--warm-up",
                           "--bucket-seed", "5", "--op", "kda_gate", "--impl", "tests.mutants:gate_sigmoid_unscaled",
                           "-k", "determinism"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "REFCHECK_FAILURE_DIR": str(tmp_path)})
    out = done.stdout + done.stderr
    assert "1 passed" in out and done.returncode == 1, out
    assert "warm-up examples that broke their law" in out and "law gate_bounds (10) violated" in out, out
    written = {p.name for p in tmp_path.iterdir()}
    assert "warm-up-gate_bounds-kda_gate-tests.mutants_gate_sigmoid_unscaled.txt" in written, written
    assert "warm-up-determinism-kda_gate-tests.mutants_gate_sigmoid_unscaled.txt" not in written, written
