"""A kernel author's own op, unknown to refcheck: ``prefix_sum``, registered from this package.

    o[b, t, h, :] = scale * sum_{s <= t, s in t's sequence} x[b, s, h, :]

x ``[B, T, H, D]``, packed sequences through ``cu_seqlens`` (the sum restarts at each sequence).
``CARD`` is its record: the float64 reference, how a case becomes tensors, how Hypothesis draws
cases (from refcheck's building blocks), the grid, the traits (causal, varlen: every law that
needs only those runs on it) and the implementations. Register it with ``--op-card
prefix_sum_op:CARD`` (or publish it under the entry point group ``refcheck.ops``), give its budgets
with ``--budgets budgets.toml``, and every law, the report, drift and fuzz run on it.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from refcheck.model.case import Case
from refcheck.model.ops import Inputs, OpCard
from refcheck.model.ops.inputs import cu_seqlens, normal, rounded
from refcheck.strategies import EMPTY, SMALL, dtypes, fit, head_dims, lengths, picker, seeds, seqlens

DTYPES = ("fp32", "bf16", "fp16")


def prefix_sum(x, *, scale=1.0, cu_seqlens=None):
    """The reference, in ``x.dtype`` (float64 for the truth): a cumulative sum per sequence."""
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ValueError("x: expected a [B, T, H, D] tensor")
    if cu_seqlens is None:
        return scale * x.cumsum(1)
    bounds = cu_seqlens.tolist()
    return torch.cat([scale * x[:, s:e].cumsum(1) for s, e in zip(bounds[:-1], bounds[1:])], 1)


def make_inputs(case: Case, device) -> Inputs:
    gen = torch.Generator().manual_seed(case.seed)
    d = case.dim
    tensors = {"x": rounded(normal(gen, (d["B"], d["T"], d["H"], d["D"]), device), case.torch_dtype)}
    if case.seqlens is not None:
        tensors["cu_seqlens"] = cu_seqlens(case, case.seqlens, device)
    return Inputs(tensors, ("x",), case.opts)


@st.composite
def cases(draw, impl=None, limits=SMALL, *, min_len=1, varlen=None, min_seqs=1, min_batch=1, dtype=None,
          causal=None, pinned=EMPTY):
    pick = picker(draw, pinned)
    dt = pick("dtype", dtypes(DTYPES, impl, dtype))
    h, dim = pick("H", st.integers(1, limits.max_heads)), pick("D", head_dims(limits.max_dim))
    packed = pick("packed", st.booleans() if varlen is None and min_batch == 1 else st.just(bool(varlen)))
    if packed:
        b, seqs = 1, draw(seqlens(fit(limits, 1, h, dim, min_len), limits.max_seqs, min_seqs=min_seqs,
                                  min_total=min_len, min_nonempty=min(min_seqs, 2)))
        t = sum(seqs)
    else:
        b, seqs = draw(st.integers(min_batch, max(min_batch, limits.max_batch))), None
        t = draw(lengths(min_len, fit(limits, b, h, dim, min_len)))
    options = {"scale": pick("scale", st.sampled_from([1.0, 0.5]))}
    drawn = {"cu_dtype": pick("cu_dtype", st.sampled_from(["int32", "int64"]))} if packed else {}
    return Case.make("prefix_sum", {"B": b, "T": t, "H": h, "D": dim}, dt, draw(seeds()), seqlens=seqs,
                     options=options, draw=drawn)


def grid(quick):
    base = [("dense", dict(B=2, T=40, H=2, D=16), {}), ("varlen", dict(B=1, T=50, H=2, D=16), dict(seqlens=(20, 0, 30)))]
    return base, [(f"T={t}", dict(B=1, T=t, H=1, D=8), {}) for t in ((16, 64) if quick else (32, 128))]


def boundary(t, dtype, packed, batch, require):
    return {"B": 1 if packed else batch, "T": t + 1 if packed else t, "H": 1, "D": 16}, dict(seqlens=(1, t) if packed else None)


def empty_outputs(case, x, length, n, provides):
    return {"o": x.tensors["x"].new_zeros(1, 0, case.dim["H"], case.dim["D"])}


CARD = OpCard(
    "prefix_sum", prefix_sum, None, ("o",), ("x",), DTYPES, make_inputs, cases=cases,
    traits=frozenset({"causal", "varlen"}), grid=grid, boundary=boundary, token_axes={"x": "q"},
    join_dims={"o": 1}, causal=lambda case: True, empty_outputs=empty_outputs)
