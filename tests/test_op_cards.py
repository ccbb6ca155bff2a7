"""The op records (cards): each is complete for the traits it claims, laws choose ops by trait, and
every law runs on a case of every op it applies to."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from refcheck.engine import laws
from refcheck.engine.examples import Example, cases, meets
from refcheck.model import registry
from refcheck.model.ops import OPS, REQUIREMENTS, TRAITS, card, register

PAIRS = [(law.name, op) for law in laws.LAWS.values() for op in law.ops]


@pytest.mark.parametrize("op", list(OPS))
def test_every_card_is_complete_for_its_traits(op):
    assert card(op).problems() == []
    assert set(card(op).traits) <= set(TRAITS)


@pytest.mark.parametrize("trait, hook", [("varlen", "empty_outputs"), ("causal", "causal")])
def test_a_card_stripped_of_what_a_trait_needs_is_refused(trait, hook):
    stripped = dataclasses.replace(card("gla"), name="gla_stripped", implementations=(), **{hook: None})
    assert any(trait in p and hook in p for p in stripped.problems())
    with pytest.raises(ValueError, match=hook):
        register(stripped)
    assert "gla_stripped" not in OPS


def test_a_card_without_a_trait_leaves_the_laws_that_need_it():
    plain = dataclasses.replace(card("gla"), name="gla_no_state", traits=card("gla").traits - {"state"},
                                implementations=())
    assert "state" in laws.LAWS["state_chaining"].why_not_op(plain)
    assert laws.LAWS["agreement"].why_not_op(plain) is None
    assert laws.LAWS["state_chaining"].why_not_op(card("gla")) is None


def test_laws_name_no_op_and_every_requirement_has_a_trait_or_none():
    for law in laws.LAWS.values():
        assert set(law.requires) <= set(REQUIREMENTS)
        assert law.needs <= set(TRAITS)
    # the trait of each requirement decides where a law applies, not a list of op names
    assert laws.LAWS["fp16_gates"].needs == {"decay_gate"}
    assert set(laws.LAWS["key_permutation"].needs) == {"causal", "keys"}


def _runnable(law, op):
    return [i for i in registry.implementations(op) if i.unavailable("cpu") is None and law.why_not(i) is None]


def _draw(law, op, impl):
    seen = []

    @settings(max_examples=1, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(op, impl, laws.INTERPRETED, **law.requires))
    def draw(case):
        seen.append(case)

    draw()
    return seen[0]


@pytest.mark.parametrize("law_name, op", PAIRS)
def test_every_op_draws_a_case_for_every_law_it_is_under(law_name, op):
    """The card draws a case meeting the law's requirements, and the same requirements check it."""
    law = laws.LAWS[law_name]
    case = _draw(law, op, None)
    assert case.op == op and meets(case, law.requires), case.describe()


RUNNABLE = [(law, op) for law, op in PAIRS if _runnable(laws.LAWS[law], op)]


def test_every_law_runs_somewhere_on_the_cpu():
    assert {law for law, _ in RUNNABLE} == set(laws.LAWS)


@pytest.mark.parametrize("law_name, op", RUNNABLE)
def test_every_law_runs_on_a_case_of_every_op_it_applies_to(law_name, op):
    """The law runs on a drawn case with the first CPU implementation it applies to (the naive form
    where it does; our interpreted kernel for the path and precision laws)."""
    law = laws.LAWS[law_name]
    impl = _runnable(law, op)[0]
    case = _draw(law, op, impl)
    laws.check(law, impl, Example(case, impl.modes[0], laws.path_knobs(impl)[0], laws.fixed_params(law, case)))


@pytest.mark.parametrize("knobs", [
    {},
    {"a": (1, 2, 3)},
    {"a": (True, False), "b": (64, 128)},
    {"a": (True, False), "b": (False, True), "c": (None, 1)},
    {"a": (1, 2, 3), "b": ("x", "y"), "c": (None, 0), "d": (True, False)},
])
def test_path_knobs_meet_every_pair_of_values_defaults_first(knobs):
    import itertools
    impl = dataclasses.replace(registry.get("kda", "triton"), knobs={"precision": ("tf32",), **knobs})
    combos = laws.path_knobs(impl)
    assert combos[0] == {n: v[0] for n, v in knobs.items()}
    if len(knobs) < 3:
        assert len(combos) == max(1, len(list(itertools.product(*knobs.values()))))
    for (a, va), (b, vb) in itertools.combinations(knobs.items(), 2):
        met = {(c[a], c[b]) for c in combos}
        assert met == set(itertools.product(va, vb)), (a, b)
    assert len(combos) < len(list(itertools.product(*knobs.values()))) or len(knobs) < 3
