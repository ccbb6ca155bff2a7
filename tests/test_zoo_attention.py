"""The attention zoo (``tests.zoo.attention``): correct kernels written from other standard formulas
(online softmax, flash backward, dense textbook) pass against the float64 truth, on ordinary cases and
on the minimal degenerate ones (one key, a saturated softmax), and each buggy twin is caught by a law
on a case that exposes it."""
from __future__ import annotations

import pytest

from refcheck.engine.examples import Example
from refcheck.engine.laws import LawViolation, check
from refcheck.engine.verify import verify
from refcheck.model import registry
from refcheck.model.case import Case

CORRECT = ("online_softmax_b16", "online_softmax_b128_p_input", "flash_backward_fp32", "flash_backward_input_dtype",
           "dense_textbook")
DTYPES = ("fp32", "bf16", "fp16")


def zoo(name: str) -> registry.Implementation:
    return registry.resolve(f"attention=tests.zoo.attention:{name}")[0]


def attention(dtype="fp32", seed=0, *, seqlens=None, seqlens_k=None, draw=None, **dims_and_options) -> Case:
    options = {k: dims_and_options.pop(k) for k in ("causal", "scale") if k in dims_and_options}
    dims = dict(dict(B=1, T=8, S=8, H=2, Hk=1, Dqk=16, Dv=16), **dims_and_options)
    return Case.make("attention", dims, dtype, seed, seqlens=seqlens, seqlens_k=seqlens_k, options=options, draw=draw)


ORDINARY = {
    "gqa_causal_T>S": dict(B=2, T=50, S=40, H=4, Hk=2, Dqk=32, Dv=24, causal=True),
    "varlen_empty_span": dict(T=40, S=50, H=4, Hk=4, Dqk=32, Dv=24, seqlens=(13, 0, 27), seqlens_k=(20, 5, 25)),
    "mla_causal_blocks": dict(T=20, S=150, H=2, Hk=1, Dqk=192, Dv=128, causal=True, scale=0.2),
    "varlen_no_keys": dict(T=30, S=20, H=6, Hk=2, seqlens=(10, 20), seqlens_k=(0, 20), causal=True,
                           draw={"cu_dtype": "int64"}),
}


@pytest.fixture(autouse=True)
def _restore_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("label", ORDINARY)
@pytest.mark.parametrize("name", CORRECT)
def test_correct_members_pass_ordinary_cases(name, label, dtype):
    verdict = verify(zoo(name), attention(dtype, seed=len(label), **ORDINARY[label]))
    assert verdict.passed, verdict.table()


DEGENERATE = [pytest.param(dict(T=t, S=1, Dqk=dqk, Dv=dv), id=f"T={t},S=1,D={dqk}/{dv}")
              for t in (1, 2, 3) for dqk, dv in ((192, 128), (16, 16))]
DEGENERATE += [pytest.param(dict(T=t, S=2, Dqk=16, Dv=16, scale=1.0), id=f"T={t},S=2,scale=1") for t in (1, 2, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", DEGENERATE)
@pytest.mark.parametrize("name", CORRECT)
def test_correct_members_pass_degenerate_cases(name, shape, dtype):
    """One key (softmax exactly 1, o = v) and a saturated two-key softmax: where the naive form's error
    is ~0, the first stage of the bound gives a false alarm unless the Monte Carlo stage judges it."""
    verdict = verify(zoo(name), attention(dtype, seed=7, B=1, H=1, Hk=1, **shape))
    assert verdict.passed, verdict.table()


BUGS = {
    "bug_causal_top_left": dict(T=8, S=24, causal=True),
    "bug_gqa_head_modulo": dict(H=4, Hk=2),
    "bug_varlen_key_leak": dict(T=12, S=14, seqlens=(5, 7), seqlens_k=(6, 8)),
    "bug_no_rescale": dict(T=16, S=48),
    "bug_lse_log2": dict(),
}
WRONG = {"bug_lse_log2": {"lse", "dq", "dk"}}


@pytest.mark.parametrize("name", BUGS)
def test_each_bug_fails_agreement_on_a_case_that_exposes_it(name):
    case = attention("fp32", seed=3, **BUGS[name])
    verdict = verify(zoo(name), case)
    assert not verdict.passed, verdict.table()
    failed = {m.output for m in verdict.measurements if not m.passed}
    assert failed >= WRONG.get(name, {"o"}), verdict.table()
    with pytest.raises(LawViolation, match="law agreement"):
        check("agreement", zoo(name), Example(case, "ieee"))


@pytest.mark.parametrize("name", BUGS)
def test_the_correct_members_pass_the_cases_that_expose_the_bugs(name):
    case = attention("fp32", seed=3, **BUGS[name])
    for member in ("online_softmax_b16", "flash_backward_input_dtype"):
        verdict = verify(zoo(member), case)
        assert verdict.passed, verdict.table()


def test_top_left_mask_breaks_causality_where_queries_outnumber_keys():
    case = attention("fp32", seed=1, T=12, S=6, causal=True)
    with pytest.raises(LawViolation, match="law causality"):
        check("causality", zoo("bug_causal_top_left"), Example(case, "ieee", params={"cut": 5}))
    check("causality", zoo("online_softmax_b16"), Example(case, "ieee", params={"cut": 5}))


def test_key_leak_breaks_varlen_equals_separate():
    case = attention("fp32", seed=2, T=12, S=14, seqlens=(5, 7), seqlens_k=(6, 8))
    with pytest.raises(LawViolation, match="law varlen_equals_separate"):
        check("varlen_equals_separate", zoo("bug_varlen_key_leak"), Example(case, "ieee"))
    check("varlen_equals_separate", zoo("online_softmax_b16"), Example(case, "ieee"))


def test_no_rescale_is_right_within_one_key_block():
    """The missing rescale only matters once a later block raises a row's max: with S <= 16 it is exact."""
    verdict = verify(zoo("bug_no_rescale"), attention("fp32", seed=3, T=16, S=16))
    assert verdict.passed, verdict.table()


@pytest.mark.parametrize("change, argument", [
    (dict(k_heads=3), "k"), (dict(scale=-1.0), "scale"), (dict(cu_only_q=True), "cu_seqlens"),
])
def test_bad_input_names_the_argument(change, argument):
    import torch

    from tests.zoo.attention import flash_backward_fp32
    q, k, v = torch.randn(1, 4, 4, 16), torch.randn(1, 4, change.get("k_heads", 2), 16), torch.randn(1, 4, 2, 16)
    if change.get("k_heads"):
        v = torch.randn(1, 4, change["k_heads"], 16)
    kwargs = {"scale": change["scale"]} if "scale" in change else {}
    if change.get("cu_only_q"):
        kwargs["cu_seqlens_q"] = torch.tensor([0, 4])
    with pytest.raises(ValueError, match=argument):
        flash_backward_fp32(q, k, v, **kwargs)


# --- the extensions: window, softcap, sinks -------------------------------------------------------------------------

EXTENSION_LAWS = ("agreement", "window_locality", "sinks_neutral", "grouped_heads", "varlen_equals_separate")


@pytest.mark.parametrize("law", EXTENSION_LAWS)
@pytest.mark.parametrize("name", ["online_softmax_b16", "flash_backward_input_dtype", "dense_textbook"])
def test_correct_members_hold_the_laws_with_windows_softcaps_and_sinks(name, law):
    """Written from other formulas than the reference (the window as an index test of its own, sinks folded
    in after the last key block or as a last column of logsumexp, the flash backward's own softcap and sink
    gradients): every law that concerns the extensions holds on the ci draws, which use them a third of the
    time each (window_locality and sinks_neutral: always)."""
    from hypothesis import settings

    from refcheck.engine.laws import hypothesis_check
    [impl] = registry.resolve(f"attention=tests.zoo.attention:{name}")
    hypothesis_check(law, impl, settings=settings(max_examples=12, deadline=None, database=None, derandomize=True))
