"""Extensions: the parts of an op's contract a kernel may decline (``refcheck.model.ops.card.Extension``).

A textbook Gated DeltaNet kernel (no gate computed in the kernel, one value head per query/key head) is a
correct kernel of the textbook form: it fits the contract, is never drawn a case of what it declines,
the grid leaves those cases out and says so, and every law still runs on it. Taking part of an
extension's keywords is a contract error; declining an extension the op does not have is a usage error.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from refcheck.engine import grid
from refcheck.engine.examples import cases
from refcheck.engine.laws import hypothesis_check
from refcheck.model import registry
from refcheck.model.implementation import Implementation
from refcheck.model.naive import naive_form
from refcheck.model.ops import card
from refcheck.model.registry import SpecError

OP = "gated_delta_rule"


def textbook_gdr(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                 cu_seqlens=None, use_qk_l2norm=False):
    """Gated DeltaNet without the gate or beta's sigmoid computed in the kernel and with the state key-first (it
    has no use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first)."""
    return naive_form(OP)(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm)


def half_gate_gdr(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                  cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False):
    """Takes use_gate_in_kernel but neither A_log nor dt_bias: half an extension."""
    raise AssertionError("never called: the contract refuses it")


TEXTBOOK = Implementation(OP, "textbook", f"{__name__}:textbook_gdr", declines=("grouped_value_heads",),
                          description="no in-kernel gate (by its signature), no grouped value heads (declined)")


def test_a_kernel_without_an_extensions_keywords_fits_the_contract_and_declines_it():
    assert registry.contract_problems(textbook_gdr, OP) == []
    by_signature = {"gate_in_kernel", "beta_in_kernel", "state_v_first", "state_pool"}
    assert card(OP).declined(TEXTBOOK) == by_signature | {"grouped_value_heads"}
    plain = dataclasses.replace(TEXTBOOK, declines=())
    assert card(OP).declined(plain) == by_signature
    assert card(OP).declined(registry.get(OP, "naive")) == frozenset()


def test_half_an_extension_is_a_contract_error_naming_it():
    problems = registry.contract_problems(half_gate_gdr, OP)
    assert len(problems) == 1 and "'gate_in_kernel'" in problems[0] and "'A_log'" in problems[0], problems


def test_declining_an_extension_the_op_does_not_have_is_a_usage_error():
    globals()["TYPO"] = dataclasses.replace(TEXTBOOK, declines=("grouped_heads",))
    with pytest.raises(SpecError, match="grouped_heads.*grouped_value_heads"):
        registry.resolve(f"{__name__}:TYPO")


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(OP, TEXTBOOK))
def test_drawn_cases_use_no_declined_extension(case):
    assert "HV" not in case.dim and not case.opts.get("use_gate_in_kernel"), case


def test_the_cases_of_a_kernel_that_declines_nothing_use_the_extensions():
    """The strategy does draw both (so the test above is not vacuous)."""
    seen: set[str] = set()

    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(OP, registry.get(OP, "naive")))
    def collect(case):
        seen.update(card(OP).uses_declined(case, frozenset({"gate_in_kernel", "grouped_value_heads"})))
    collect()
    assert seen == {"gate_in_kernel", "grouped_value_heads"}


def test_the_grid_leaves_out_a_declined_extensions_cases_and_says_how_many(monkeypatch):
    monkeypatch.setitem(registry._registry, (OP, "textbook"), TEXTBOOK)
    g = grid.build("cpu", ops=[OP], impls=["textbook", "naive"])
    mine = [p for p in g.points if p.impl.name == "textbook"]
    theirs = [p for p in g.points if p.impl.name == "naive"]
    assert mine and all(not card(OP).uses_declined(p.case, card(OP).declined(TEXTBOOK)) for p in mine)
    labels = {p.entry.label for p in theirs} - {p.entry.label for p in mine}
    assert labels == {"gva", "gate_in_kernel", "beta_logits_v_first"}, labels
    declined = {(impl, ext): n for op, impl, ext, n in g.declined}
    n_dtypes = len(card(OP).dtypes)
    assert declined == {("textbook", "grouped_value_heads"): 2 * n_dtypes, ("textbook", "gate_in_kernel"): n_dtypes,
                        ("textbook", "beta_in_kernel"): n_dtypes, ("textbook", "state_v_first"): n_dtypes}


@pytest.mark.parametrize("law", ["agreement", "varlen_equals_separate", "state_chaining"])
def test_laws_run_on_a_kernel_that_declines_extensions(law):
    hypothesis_check(law, TEXTBOOK, settings=settings(max_examples=6, deadline=None, database=None))
