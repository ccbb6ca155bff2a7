"""Law 14 (grouped_heads) against kernels written from other formulas than ours: the zoo's attention (online
softmax in key blocks, the flash backward, the dense textbook form) and delta rules (the WY form, the
recurrence in the input dtype) hold it; the zoo's GQA bug (query head h reads key head h % Hk) breaks it; a
kernel that declines grouped value heads is not held to it. The mutants it kills: ``tests/mutants.py``."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import Phase, settings

from refcheck.engine.laws import LawViolation, hypothesis_check, law
from refcheck.model import registry

CHECK = settings(max_examples=8, deadline=None, database=None, derandomize=True)
CORRECT = [("attention", "attention", name) for name in
           ("online_softmax_b16", "online_softmax_b128_p_input", "flash_backward_fp32", "dense_textbook")] + \
          [("gated_delta_rule", "linear", name) for name in
           ("gated_delta_rule_wy_fp32", "gated_delta_rule_recurrent_input_dtype")]


@pytest.fixture(autouse=True)
def restore_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


@pytest.mark.parametrize("op,module,name", CORRECT, ids=[c[2] for c in CORRECT])
def test_kernels_from_other_formulas_hold_it(op, module, name):
    [impl] = registry.resolve(f"{op}=tests.zoo.{module}:{name}")
    hypothesis_check("grouped_heads", impl, settings=CHECK)


def test_a_key_head_read_by_the_wrong_group_breaks_it():
    [impl] = registry.resolve("attention=tests.zoo.attention:bug_gqa_head_modulo")
    with pytest.raises(LawViolation, match="law grouped_heads"):     # found, not shrunk: the kill is the point
        hypothesis_check("grouped_heads", impl, settings=settings(CHECK, phases=[Phase.generate]), multiple=False)


def test_a_kernel_that_declines_grouped_value_heads_is_not_held_to_it():
    impl = dataclasses.replace(registry.get("gated_delta_rule", "naive"), declines=("grouped_value_heads",))
    assert law("grouped_heads").why_not(impl) == "declines extension grouped_value_heads"
    assert law("grouped_heads").why_not(registry.get("gated_delta_rule", "naive")) is None
    assert "trait(s) grouped_heads" in law("grouped_heads").why_not(registry.get("kda", "naive"))   # none in kda
