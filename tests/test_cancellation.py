"""A gate gradient that cancels to 0 (``dg`` at T = 1 without an initial state, and KDA's
``dA_log``, ``ddt_bias`` through its in-kernel gate): a correct kernel that forms
``q * dq - k * dk`` in float32 leaves a rounding residue there (flash-linear-attention on an H100:
``chunk_gla`` dg 4.9e-10 RMS, ``chunk_kda`` dA_log 2.5e-10, against terms of ~1), which no naive
form shows. The bound allows ``CANCELLATION_ULPS`` float32 ulps of the terms where the truth
vanishes, and nothing more anywhere else; a wrong gradient at T = 1 still fails."""
from __future__ import annotations

import pytest
import torch

from refcheck.engine.verify import measure, truth
from refcheck.model.case import Case

KDA_GATE = {"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -3.0}
CASES = [("gla", "dg", {}), ("simple_gla", "dg", {}), ("kda", "dg", {}),
         ("kda", "dA_log", KDA_GATE), ("kda", "ddt_bias", KDA_GATE), ("kda", "dg", KDA_GATE)]


def case(op: str, length: int, options: dict, dtype: str = "fp16") -> Case:
    gates = "fp32" if dtype == "fp32" or options else "fp16"
    return Case.make(op, {"B": 1, "T": length, "H": 2, "K": 8, "V": 60}, dtype, 3, options=options,
                     draw={"gate_dtype": gates, "initial_state": False, "dt_bias": True})


def measured(c: Case, name: str, shift):
    """Output ``name`` of an implementation equal to the truth except ``+ shift(natural size)``."""
    import dataclasses

    from refcheck.model import registry
    ref = truth(c, True, None)
    out = {n: t.to(torch.float32) if t.is_floating_point() else t for n, t in ref.items()}
    out["o"] = ref["o"].to(c.torch_dtype)
    kernel = dataclasses.replace(registry.get(c.op, "naive"), name="kernel")   # judged by the contract entries
    natural = next(m for m in measure(kernel, c, out, ref, mode="ieee").measurements if m.output == name).natural_scale
    gen = torch.Generator().manual_seed(0)
    out[name] = (ref[name] + shift(natural) * torch.randn(ref[name].shape, generator=gen, dtype=torch.float64)).float()
    return next(m for m in measure(kernel, c, out, ref, mode="ieee").measurements if m.output == name)


@pytest.mark.parametrize("op, name, options", CASES)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_a_float32_residue_where_the_gradient_vanishes_passes(op, name, options, dtype):
    m = measured(case(op, 1, options, dtype), name, lambda natural: 2.0 ** -24 * natural)
    assert m.natural_scale > 1e-3 and m.cancellation > 0 and m.passed, m.explanation


@pytest.mark.parametrize("op, name, options", CASES)
def test_a_wrong_gradient_where_it_vanishes_fails(op, name, options):
    m = measured(case(op, 1, options), name, lambda natural: 1e-3 * natural)
    assert not m.passed, m.explanation


@pytest.mark.parametrize("op, name, options", CASES)
def test_no_allowance_where_the_gradient_does_not_vanish(op, name, options):
    m = measured(case(op, 40, options), name, lambda natural: 0.0)
    assert m.cancellation == 0 and m.natural_scale > 0


def test_precision_modes_allow_the_residue_where_the_gradient_vanishes():
    """Law 8 orders the modes' errors up to the same residue: our KDA kernel's dg at T = 1 without a
    state (truth 0) is 3.0e-6 under ieee and exactly 0 under tf32x3 (a fuzz run's counterexample), the
    rounding of ``q * dq - k * dk``, not a mode ignored."""
    from refcheck.engine.reproduce import law
    law("precision_modes", "triton", Case.make(
        "kda", {"B": 1, "H": 1, "K": 1, "T": 1, "V": 16}, "fp32", 0,
        options={"lower_bound": None, "output_final_state": False, "safe_gate": False, "scale": None,
                 "use_gate_in_kernel": False, "use_qk_l2norm": False},
        draw={"gate_dtype": "fp32", "initial_state": False, "mask_p": 0.0, "normalizer": 1.0, "spike_p": 0.0}),
        mode="ieee", knobs={"use_gather": True, "disable_recompute": False})
