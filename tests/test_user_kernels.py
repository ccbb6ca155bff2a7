"""A kernel author's own kernels (``examples/my_simple_gla``): named one way everywhere, checked up
front, judged by the contract bounds (the correct kernel in both precisions passes, each bug fails),
caught by the grid and by the ci profile's fixed chunk-boundary examples, with reproducers that
name the user's module."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from refcheck.commands.selection import SelectionError, items, select
from refcheck.engine import grid
from refcheck.engine.laws import LawViolation, hypothesis_check
from refcheck.engine.verify import verify
from refcheck.model import registry
from refcheck.strategies import profiles

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "my_simple_gla"
CI = settings(**profiles.PROFILES["ci"])


@pytest.fixture
def mykernels(monkeypatch):
    """The example package importable, and the registry restored after the test."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))

    def impl(name: str, **kw) -> registry.Implementation:
        return registry.resolve(f"simple_gla=mykernels:{name}", **kw)[0]
    return impl


def test_lists_are_repeatable_and_comma_separated():
    assert items(["kda,gla", "attention", " simple_gla , "]) == ["kda", "gla", "attention", "simple_gla"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(ops=["kdaa"]), "--op kdaa: unknown op"),
    (dict(ops=["simple_gla"], dtypes=["fp64"]), "simple_gla has no such inputs"),
    (dict(dtypes=["fp8"]), "--dtype fp8: unknown dtype"),
    (dict(dtypes=["fp9"]), "--dtype fp9: unknown dtype"),
    (dict(dtypes=["torch.bfloat17"]), r"--dtype torch.bfloat17: unknown dtype; expected one of fp64, fp32, bf16, .* "
                                      r"torch's names \(float64, float32, bfloat16"),
    (dict(impls=["simple_gla=no_such_module:fn"]), "cannot import module 'no_such_module'"),
    (dict(impls=["simple_gla=mykernels:nope"]), "has no attribute 'nope'"),
    (dict(impls=["mykernels:chunk_simple_gla"]), "which op does it implement"),
    (dict(impls=["kda=mykernels:chunk_simple_gla"]), "missing argument 'beta'"),
    (dict(impls=["simple_gla=mykernels:chunk_simple_gla"], dtypes=["fp64"]), "simple_gla has no fp64 inputs"),
    (dict(impls=["fa4"]), "attention/fa4 cannot run on cpu"),
    (dict(budgets=["no_such_file.toml"]), "no such file"),
])
def test_usage_errors_name_the_option(mykernels, kwargs, message):
    with pytest.raises(SelectionError, match=message):
        select(device="cpu", **kwargs)


@pytest.mark.parametrize("given, short", [("float16", "fp16"), ("torch.float16", "fp16"), ("bfloat16", "bf16"),
                                          ("torch.bfloat16", "bf16"), ("float32", "fp32"), ("half", "fp16"),
                                          ("bf16", "bf16")])
def test_dtype_takes_torchs_names_too(given, short):
    assert select(ops=["simple_gla"], dtypes=[f"{given},fp32"], device="cpu").dtypes == tuple(dict.fromkeys((short, "fp32")))


def test_module_callable_needs_the_op_only_once(mykernels):
    chosen = select(impls=["mykernels:chunk_simple_gla"], ops=["simple_gla"], device="cpu")
    assert [(i.op, i.name) for i in chosen.named] == [("simple_gla", "mykernels:chunk_simple_gla")]
    assert chosen.named[0].dtypes == ("fp32", "bf16", "fp16") and chosen.named[0].backward


@pytest.mark.parametrize("name", ["chunk_simple_gla", "chunk_simple_gla_input_dtype"])
def test_correct_kernels_pass_every_grid_case(mykernels, name):
    impl = mykernels(name)
    for entry in grid.cases("simple_gla"):
        verdict = verify(impl, entry.case)
        assert verdict.passed, verdict.table()


@pytest.mark.parametrize("name, label", [("bug_state_leak", "varlen_no_h0"),
                                         ("bug_chunk_boundary", "chunk_plus_one"),
                                         ("bug_double_scale", "dense"),
                                         ("bug_last_gate", "dense")])
def test_each_bug_fails_a_grid_case_made_for_it(mykernels, name, label):
    impl = mykernels(name)
    verdicts = [verify(impl, e.case) for e in grid.cases("simple_gla") if e.label == label]
    assert verdicts and not all(v.passed for v in verdicts)
    failed = next(v for v in verdicts if not v.passed)
    line = next(m for m in failed.measurements if not m.passed)
    assert "naive error on this case" in line.explanation and "[simple_gla." in line.explanation


def test_the_ci_profile_meets_the_chunk_boundary_bug_in_its_fixed_examples(mykernels):
    impl = mykernels("bug_chunk_boundary")
    with pytest.raises(LawViolation, match=r"T=65,"):
        hypothesis_check("agreement", impl, settings=settings(CI, max_examples=2), boundaries=True)


def test_the_reproducer_of_a_user_kernel_reproduces_from_another_folder(mykernels, tmp_path):
    impl = mykernels("bug_state_leak")
    case = next(e.case for e in grid.cases("simple_gla") if e.label == "varlen_no_h0" and e.case.dtype == "fp32")
    verdict = verify(impl, case)
    assert not verdict.passed
    command = verdict.reproducer()
    assert str(EXAMPLE) in command and "'simple_gla=mykernels:bug_state_leak'" in command
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode != 0 and "PointFailure" in done.stderr and "FAIL" in done.stdout, done.stdout + done.stderr


def _pytest(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "refcheck.properties", "-p", "no:cacheprovider",
                           "-q", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_the_plugin_refuses_a_kernel_that_does_not_import(tmp_path):
    done = _pytest(tmp_path, "--impl", "simple_gla=no_such_module:fn")
    assert done.returncode == 4 and "cannot import module 'no_such_module'" in done.stderr, done.stdout + done.stderr


def test_the_plugin_refuses_a_bad_budgets_file_before_any_kernel(tmp_path):
    bad = tmp_path / "b.toml"
    bad.write_text('[simple_gla.o.bf16]\nmetric = "naive_ratio"\nieeee = 3\n')
    done = _pytest(tmp_path, "--impl", "naive", "--budgets", str(bad))
    assert done.returncode == 4 and "unknown key(s) ['ieeee']" in done.stderr, done.stdout + done.stderr
