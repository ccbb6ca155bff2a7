"""A gate gradient that cancels to 0 (``dg`` at T = 1 without an initial state): a correct kernel
that forms ``q * dq - k * dk`` in float32 leaves a rounding residue there (flash-linear-attention's
``chunk_gla`` did on an H100: 4.9e-10 RMS against terms of ~2), which no naive form shows. The
bound allows ``CANCELLATION_ULPS`` float32 ulps of the terms where the truth vanishes, and nothing
more anywhere else; a wrong dg at T = 1 still fails."""
from __future__ import annotations

import pytest
import torch

from refcheck.case import Case
from refcheck.verify import measure, truth


def case(op: str, length: int, dtype: str = "fp16") -> Case:
    gates = "fp32" if dtype == "fp32" else "fp16"
    return Case.make(op, {"B": 1, "T": length, "H": 2, "K": 8, "V": 60}, dtype, 3, options={},
                     draw={"gate_dtype": gates, "initial_state": False})


def dg_measurement(c: Case, shift):
    """dg of an implementation equal to the truth except ``dg + shift(natural size)``."""
    from refcheck import registry
    ref = truth(c, True, None)
    out = {n: t.to(torch.float32) if t.is_floating_point() else t for n, t in ref.items()}
    out["o"] = ref["o"].to(c.torch_dtype)
    first = measure(registry.get(c.op, "naive"), c, out, ref, mode="ieee")
    natural = next(m for m in first.measurements if m.output == "dg").natural_scale
    gen = torch.Generator().manual_seed(0)
    out["dg"] = (ref["dg"] + shift(natural) * torch.randn(ref["dg"].shape, generator=gen, dtype=torch.float64)).float()
    verdict = measure(registry.get(c.op, "naive"), c, out, ref, mode="ieee")
    return next(m for m in verdict.measurements if m.output == "dg")


@pytest.mark.parametrize("op", ["gla", "simple_gla"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_a_float32_residue_where_dg_vanishes_passes(op, dtype):
    m = dg_measurement(case(op, 1, dtype), lambda natural: 2.0 ** -24 * natural)
    assert m.natural_scale > 0.1 and m.cancellation > 0 and m.passed, m.explanation


@pytest.mark.parametrize("op", ["gla", "simple_gla"])
def test_a_wrong_dg_where_it_vanishes_fails(op):
    m = dg_measurement(case(op, 1), lambda natural: 1e-3 * natural)
    assert not m.passed, m.explanation


@pytest.mark.parametrize("op", ["gla", "simple_gla"])
def test_no_allowance_where_dg_does_not_vanish(op):
    m = dg_measurement(case(op, 40), lambda natural: 0.0)
    assert m.cancellation == 0 and m.natural_scale > 0
