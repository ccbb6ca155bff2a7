"""The record of ``kda_gate`` (KDA's in-kernel gate: the log-decay from raw gate activations).

Math, shapes and options: ``references/gates.py``. Our kernel: ``optimized/kda/gate.py``. Budgets:
``[kda_gate.*]`` in ``tolerances.toml``. Laws: those for every op and the gate_function laws
(bounds, monotone), ``refcheck/engine/laws.py``.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from hypothesis import strategies as st

from refcheck import references

from ...strategies import EMPTY, SMALL, Limits, dtypes, fit, head_dims, lengths, lower_bounds, picker, seeds
from ..case import Case
from ..implementation import Implementation
from .card import Inputs, OpCard, Template, Templates
from .inputs import normal, rounded
from .linear import LINEAR_DTYPES


def make_inputs(case: Case, device) -> Inputs:
    """g ``[B, T, H, K]`` at the case's input scale, A_log ``[H]``, dt_bias ``[H * K]`` or not."""
    d = case.dim
    gen = torch.Generator().manual_seed(case.seed)
    b, t, h, k = d["B"], d["T"], d["H"], d["K"]
    scale = float(case.drawn.get("input_scale", 1.0))
    tensors = {"g": rounded(normal(gen, (b, t, h, k), device, scale), case.torch_dtype),
               "A_log": (torch.rand(h, generator=gen) * 2.5).to(device)}
    if case.drawn.get("dt_bias", True):
        tensors["dt_bias"] = normal(gen, (h * k,), device, 0.5)
    return Inputs(tensors, ("g", "A_log"), case.opts)


@st.composite
def cases(draw, impl=None, limits: Limits = SMALL, *, min_len: int = 1, min_batch: int = 1,
          dtype: str | None = None, pinned: Mapping = EMPTY) -> Case:
    """g at scale 1, 10 or 30 (softplus beyond 20, saturated sigmoids), A_log, dt_bias or not, the
    softplus form or the lower-bound form."""
    pick = picker(draw, pinned)
    dt = pick("dtype", dtypes(LINEAR_DTYPES, impl, dtype))
    h, k = pick("H", st.integers(1, limits.max_heads)), pick("K", head_dims(limits.max_dim))
    b = draw(st.integers(min_batch, max(min_batch, limits.max_batch)))
    t = draw(lengths(min_len, fit(limits, b, h, k, min_len)))
    options = {"lower_bound": pick("lower_bound", st.one_of(st.none(), lower_bounds()))}
    drawn = {"input_scale": draw(st.sampled_from([1.0, 10.0, 30.0])), "dt_bias": pick("dt_bias", st.booleans())}
    return Case.make("kda_gate", {"B": b, "T": t, "H": h, "K": k}, dt, draw(seeds()), options=options, draw=drawn)


def grid(quick: bool) -> Templates:
    """The softplus form and the lower-bound (sigmoid) form; elementwise, so no sweep."""
    dims = dict(B=1, T=16, H=1, K=8) if quick else dict(B=2, T=33, H=2, K=16)
    base: list[Template] = [("dense", dims, {})]
    if not quick:
        base.append(("lower_bound", dims, dict(options={"lower_bound": -5.0})))
    return base, []


CARD = OpCard(
    "kda_gate", references.kda_gate, None, ("gate",), ("g", "A_log", "dt_bias"), LINEAR_DTYPES, make_inputs,
    cases=cases, traits=frozenset({"gate_function"}), grid=grid, token_axes={"g": "q"}, join_dims={"gate": 1},
    shared_inputs=("A_log", "dt_bias"),
    implementations=(Implementation("kda_gate", "triton", "refcheck.optimized:kda_gate", triton=True,
                                    description="our Triton gate kernel"),))
