"""``refcheck verify``: one verdict a harness can read. A correct kernel written from another formula passes
(the grid and every law it is held to); a kernel that games the check fails, the law or grid point that
caught it named with a reproducer; a kernel whose laws the time did not reach is incomplete, not a pass; a usage
error is a verdict of its own and runs nothing; the JSON keys are those of schema refcheck.verdict/3."""
from __future__ import annotations

import json

import pytest

from refcheck.commands import cli
from refcheck.commands.verify import SCHEMA
from refcheck.model import registry
from refcheck.model.naive import naive_form

KEYS = {"schema", "op", "impl", "spec", "device", "isolated", "refcheck", "seed", "verdict", "seconds", "grid",
        "declined", "laws", "failures", "uncovered"}


@pytest.fixture(autouse=True)
def restore_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


def no_gva_gdr(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
               use_qk_l2norm=False):
    """A textbook Gated DeltaNet that refuses grouped value heads, and whose record does not decline them."""
    if v.shape[2] != q.shape[2]:
        raise NotImplementedError("no grouped value heads")
    return naive_form("gated_delta_rule")(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                          output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                          use_qk_l2norm=use_qk_l2norm)


def verify(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main(["verify", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_correct_kernel_of_another_formula_passes(capsys):
    """A pass needs every law to get an example after the grid: in 20 s each of the 13 laws gets 40 to 140 on an idle
    core (with 8 s, a CI run on a loaded machine left a law none: incomplete, the verdict for too little time)."""
    code, v = verify(capsys, "attention", "--impl", "tests.zoo.attention:online_softmax_b16", "--seconds", "20")
    assert code == 0 and v["verdict"] == "pass" and v["failures"] == [], v
    assert set(v) == KEYS and v["schema"] == SCHEMA
    assert v["grid"]["points"] > 0 and v["grid"]["failed"] == 0
    held = [s for s in v["laws"]["searched"] if s["status"].startswith("holds")]
    assert len(held) == len(v["laws"]["searched"]) and all(s["examples"] > 0 for s in held), v["laws"]
    assert v["declined"] == [] and v["spec"] == "tests.zoo.attention:online_softmax_b16" and v["uncovered"] == []


def test_a_kernel_whose_laws_the_time_did_not_reach_is_incomplete(capsys):
    """The same correct kernel with too little time for the laws after the grid: no pass (a slow kernel cannot pass
    by leaving the laws no time), the laws it owes named, exit status 3."""
    code, v = verify(capsys, "attention", "--impl", "tests.zoo.attention:online_softmax_b16", "--seconds", "0.01")
    assert code == 3 and v["verdict"] == "incomplete" and v["failures"] == [] and set(v) == KEYS, v
    assert v["grid"]["points"] > 0 and v["grid"]["failed"] == 0
    assert v["uncovered"] == [s["law"] for s in v["laws"]["searched"]] and v["uncovered"], v["laws"]


def test_a_kernel_that_games_the_check_fails_with_the_law_that_caught_it(capsys):
    code, v = verify(capsys, "attention", "--impl", "tests.gaming:attention_lazy_subclass", "--seconds", "3")
    assert code == 1 and v["verdict"] == "fail" and set(v) == KEYS, v
    first = v["failures"][0]
    assert first["kind"] == "grid" and "plain torch.Tensor" in first["message"], first
    code, v = verify(capsys, "gated_delta_rule", "--impl", "tests.gaming:gdr_cached_by_shape", "--seconds", "10",
                     "--dtype", "fp32")
    assert code == 1 and v["verdict"] == "fail", v
    law = next(f for f in v["failures"] if f["kind"] == "law")
    assert law["law"] and law["reproduce"].startswith("python -c"), law


def test_the_verdict_says_what_a_kernel_declines_and_hints_at_it_where_a_case_needs_it(capsys):
    code, v = verify(capsys, "gated_delta_rule", "--impl", "tests.test_verify_command:no_gva_gdr", "--seconds", "3")
    assert code == 1 and {d["extension"] for d in v["declined"]} == {"gate_in_kernel", "beta_in_kernel", "state_v_first",
                                                                     "state_pool"}
    declined = {d["extension"]: d for d in v["declined"]}
    assert all(d["grid_cases"] > 0 for name, d in declined.items() if name != "state_pool"), v["declined"]
    assert declined["state_pool"]["grid_cases"] == 0 and declined["state_pool"]["laws"] == ["state_pool"], declined
    grid = [f for f in v["failures"] if f["kind"] == "grid"]
    assert grid and all("extension(s) grouped_value_heads" in f["message"] for f in grid), grid


def test_a_usage_error_is_a_verdict_and_runs_nothing(capsys):
    code, v = verify(capsys, "attention", "--impl", "no_such_module:attention")
    assert code == 2 and v == {"schema": SCHEMA, "op": "attention", "impl": "no_such_module:attention",
                               "verdict": "usage_error", "error": v["error"]} and "--impl" in v["error"], v
    code, v = verify(capsys, "attention", "--impl", "tests.zoo.attention:online_softmax_b16", "--seconds", "0")
    assert code == 2 and "--seconds" in v["error"], v
    code, v = verify(capsys, "attention")
    assert code == 2 and "verify judges one implementation" in v["error"], v
