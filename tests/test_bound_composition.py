"""A gate gradient computed in the inputs' dtype and stored in a coarser gate dtype (fp32 q, k, v
with fp16 gates) carries both errors: its bound is the coarse dtype's plus what computing it in
the precision mode costs (``verify.computed_twin``). Seen on an H100: FLA's chunk_gla in tf32 mode,
fp32 inputs, fp16 gates, T = 2: dg 1.1e-3, judged by the fp16 bound alone (8.2e-4) as a failure."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from refcheck.engine.verify import measure, truth
from refcheck.model import registry
from refcheck.model.case import Case

CASE = Case.make("gla", {"B": 1, "H": 1, "K": 16, "T": 2, "V": 16}, "fp32", 0,
                 draw={"gate_dtype": "fp16", "initial_state": False})


def dg_bound(mode: str, relative_error: float):
    kernel = dataclasses.replace(registry.get("gla", "naive"), name="kernel", fixed_mode=mode)
    ref = truth(CASE, True, None)
    out = {n: t.float() for n, t in ref.items()}
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(ref["dg"].shape, generator=gen, dtype=torch.float64)
    out["dg"] = (ref["dg"] + relative_error * ref["dg"].norm() / noise.norm() * noise).half()
    return next(m for m in measure(kernel, CASE, out, ref, mode=mode).measurements if m.output == "dg")


def test_a_tf32_gradient_stored_in_fp16_gets_both_errors():
    m = dg_bound("tf32", 1.1e-3)
    assert m.computing is not None and m.computing.dtype == "fp32" and m.passed, m.explanation


@pytest.mark.parametrize("mode", ["ieee", "tf32"])
def test_an_error_beyond_both_fails(mode):
    m = dg_bound(mode, 0.5 if mode == "tf32" else 1.1e-2)
    assert not m.passed, m.explanation


def test_an_ieee_gradient_gains_almost_nothing():
    m = dg_bound("ieee", 0.0)
    assert m.computing.bound < 1e-4 * m.bound + 1e-5, m.explanation
