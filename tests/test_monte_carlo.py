"""The second stage of a ``naive_ratio`` bound: Monte Carlo arithmetic on the float64 reference
(``refcheck.model.monte_carlo``, ``refcheck.engine.verify.monte_carlo_bound``).

The first stage's yardstick is one evaluation order's rounding (the reference in the input dtype),
which on a degenerate case can be exactly 0 where a correct kernel of another formula is not: a gate
gradient at T = 1 without an initial state (0 in the recurrence, a residue of ``q * dq - k * dk`` in a
chunked kernel), one element that the naive form happens to round to within a hundredth of an ulp.
The Monte Carlo error sees those residues whatever the order; a bug's error is still far above it."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refcheck import references
from refcheck.engine.verify import measure, monte_carlo_error, truth
from refcheck.model import registry
from refcheck.model.case import Case
from refcheck.model.monte_carlo import random_rounding

# --- the mode ---------------------------------------------------------------------------------------


def test_each_result_moves_by_at_most_its_unit_roundoff_and_exact_ops_not_at_all():
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(64, 32, generator=gen, dtype=torch.float64) for _ in range(2))
    u = 2.0 ** -11
    with random_rounding(u, seed=1):
        product = x * y
        moved = torch.cat([x, y]).flip(0).transpose(0, 1).contiguous()
        picked = torch.where(x > 0, x, y)
        largest = x.amax(-1)
    exact = x * y
    assert 0 < float(((product - exact) / exact).abs().max()) <= u
    assert torch.equal(moved, torch.cat([x, y]).flip(0).transpose(0, 1))
    assert torch.equal(picked, torch.where(x > 0, x, y)) and torch.equal(largest, x.amax(-1))


def test_a_sum_of_terms_that_cancel_moves_by_the_terms_not_by_its_result():
    """A sum of large terms with a tiny result rounds every term: it moves by ~u x the terms' size."""
    terms = torch.tensor([1e6, 1.0, -1e6], dtype=torch.float64)
    spread = []
    for seed in range(16):
        with random_rounding(2.0 ** -24, seed):
            spread.append(float(terms.sum()) - 1.0)
    rms = math.sqrt(sum(s * s for s in spread) / len(spread))
    assert 1e6 * 2.0 ** -24 / 10 < rms < 1e6 * 2.0 ** -24 * 2


def test_samples_are_reproducible_and_differ_by_seed():
    x = torch.linspace(0.1, 1, 50, dtype=torch.float64)

    def sample(seed):
        with random_rounding(2.0 ** -8, seed):
            return torch.exp(x).sum()
    assert float(sample(3)) == float(sample(3)) != float(sample(4))


@pytest.mark.parametrize("causal, S", [(True, 2), (False, 0), (True, 5)])
def test_masked_rows_and_rows_without_keys_stay_finite(causal, S):
    """-inf scores, rows that see no key, their zero output and -inf lse: the perturbation multiplies,
    so inf stays inf and nothing becomes NaN, forward or backward."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, S, 1, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, S, 1, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    with random_rounding(2.0 ** -8, 0):
        o, lse = references.attention(q, k, v, causal=causal)
        (o.sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()).backward()
    exact_o, exact_lse = references.attention(q.detach(), k.detach(), v.detach(), causal=causal)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(exact_lse)) and bool(torch.isfinite(o).all())
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


# --- the bound --------------------------------------------------------------------------------------

def judged(case: Case, name: str, value: torch.Tensor, mode: str = "ieee"):
    """Output ``name`` of a kernel equal to the truth but for ``value``, judged by the contract bound."""
    kernel = dataclasses.replace(registry.get(case.op, "naive"), name="kernel", fixed_mode=mode)
    ref = truth(case, True, None)
    return next(m for m in measure(kernel, case, {name: value}, {name: ref[name]}, mode=mode).measurements)


KDA_GATE = {"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -3.0}
VANISHING = [("gla", "dg", {}), ("simple_gla", "dg", {}), ("kda", "dg", {}),
             ("kda", "dA_log", KDA_GATE), ("kda", "ddt_bias", KDA_GATE), ("kda", "dg", KDA_GATE)]
"""Gate gradients exactly 0 at T = 1 without an initial state: no state precedes the decay. A chunked
kernel forms them as a difference ``q * dq - k * dk`` and returns its float32 residue (FLA's chunk_gla
on an H100: dg 4.9e-10 RMS; chunk_kda dA_log 2.5e-10, against terms of ~1), which no naive form shows."""


def vanishing_case(op: str, length: int, options: dict, dtype: str) -> Case:
    gates = "fp32" if dtype == "fp32" or options else "fp16"
    return Case.make(op, {"B": 1, "T": length, "H": 2, "K": 8, "V": 60}, dtype, 3, options=options,
                     draw={"gate_dtype": gates, "initial_state": False, "dt_bias": True})


def terms(case: Case) -> float:
    """The size of the terms the gate gradient is a difference of: RMS of ``|q * dq| + |k * dk|``."""
    inputs, ref = card_inputs(case), truth(case, True, None)
    size = (inputs["q"].double() * ref["dq"]).abs() + (inputs["k"].double() * ref["dk"]).abs()
    return float(size.square().mean().sqrt())


def card_inputs(case: Case) -> dict:
    from refcheck.model.ops import card
    return card(case.op).make_inputs(case, torch.device("cpu")).tensors


def residue(case: Case, name: str, size: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    ref = truth(case, True, None)[name]
    return (ref + size * torch.randn(ref.shape, generator=gen, dtype=torch.float64)).float()


@pytest.mark.parametrize("op, name, options", VANISHING)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_a_float32_residue_where_the_gradient_vanishes_passes(op, name, options, dtype):
    c = vanishing_case(op, 1, options, dtype)
    m = judged(c, name, residue(c, name, 2.0 ** -24 * terms(c)))
    assert float(truth(c, True, None)[name].abs().max()) == 0.0 and m.passed, m.explanation
    if dtype == "fp32":   # fp16's first stage has a slack of 1e-4 (relative to the floor) that covers it
        assert m.monte_carlo is not None and "Monte Carlo" in m.explanation and "first stage gave" in m.explanation


@pytest.mark.parametrize("op, name, options", VANISHING)
def test_a_wrong_gradient_where_it_vanishes_fails(op, name, options):
    """A tenth of the terms' size is no rounding: fp16 inputs round each term by 2^-11 of it."""
    c = vanishing_case(op, 1, options, "fp16")
    m = judged(c, name, residue(c, name, 0.1 * terms(c)))
    assert not m.passed, m.explanation


def test_the_second_stage_is_asked_for_only_where_the_first_fails():
    c = vanishing_case("gla", 40, {}, "fp16")
    m = judged(c, "dg", truth(c, True, None)["dg"].half())
    assert m.passed and m.monte_carlo is None, m.explanation


SINGLE = Case.make("simple_gla", {"B": 1, "H": 1, "K": 1, "T": 1, "V": 64}, "fp16", 0, seqlens=[1],
                   options={"output_final_state": False, "scale": 2.0},
                   draw={"cu_dtype": "int64", "gate_dtype": "bf16", "initial_state": False, "mask_p": 0.0,
                         "normalizer": 1.0, "spike_p": 0.0})
"""A single-element dk (fp16, K = 1, T = 1) that the naive form rounds to within 0.04 ulp of the truth (naive error
1.8e-5, first-stage bound 4 x that + 1e-4 = 1.7e-4): our simple GLA kernel, rounding one intermediate to fp16, landed
one ulp away (6.7e-4) and failed a GPU law run's warm-up."""


def ulps_off(ulps: int) -> torch.Tensor:
    dk = truth(SINGLE, True, None)["dk"].half()
    return (dk.view(torch.int16) + ulps).view(torch.float16)


def test_one_element_one_ulp_off_passes():
    m = judged(SINGLE, "dk", ulps_off(1), mode="tf32")
    assert m.naive_error < 1e-4 and m.monte_carlo is not None and m.passed, m.explanation


def test_one_element_far_off_fails():
    error, _ = monte_carlo_error(SINGLE, "dk", 1e-6, "tf32")
    assert error is not None
    m = judged(SINGLE, "dk", ulps_off(1024), mode="tf32")
    assert not m.passed, m.explanation
