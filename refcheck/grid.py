"""The fixed, seeded verification grid: what ``refcheck report`` tables and ``refcheck drift`` records.

For every op the grid holds a few *base* cases (a dense batch and packed sequences, with the op's
main options) and a *sweep*: one dense case per sequence length ``T`` in ``SWEEP_T`` (log-spaced),
for the error-growth curves. Each case is made for every input dtype of the op card; a grid
*point* is one case run by one implementation in one precision mode::

    points = [(impl, mode, case) for op for case in cases(op) for impl available on the device
              if case.dtype in impl.dtypes for mode in impl.modes]

The cases depend only on the grid definition (this module), never on which implementations are
installed, so two records of the same grid compare even when an implementation appeared or
vanished between them. ``identity`` is that definition as data and ``grid_hash`` its SHA-256:
change a case here and ``GRID_VERSION`` must go up (old records are then refused, not misread).
Seeds are fixed per op and label, so a case rebuilds the same tensors everywhere.
"""
from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from . import registry
from .case import Case
from .ops import OPS, card

GRID_VERSION = 3
"""Bump when a case of the grid changes: records of another version are refused by ``compare``."""

SWEEP_T = (32, 128, 512)
QUICK_SWEEP_T = (16, 64)
"""Sequence lengths of the error-growth sweep (full and ``quick`` grid). Interpreted Triton costs
~0.5 s per program and chunk of 64 with the backward, so T = 512 is what fits the CPU budget."""


@dataclass(frozen=True)
class GridCase:
    """One case of the grid; ``label`` names it within its op and dtype ("dense", "T=256")."""

    label: str
    case: Case
    sweep: bool = False

    @property
    def length(self) -> int:
        """The sequence length ``T``: the x axis of the error-growth plots."""
        return self.case.dim["T"]


@dataclass(frozen=True)
class Point:
    """One implementation in one precision mode on one grid case."""

    impl: registry.Implementation
    mode: str
    entry: GridCase

    @property
    def case(self) -> Case:
        return self.entry.case

    @property
    def id(self) -> str:
        """Stable name of the point: ``op/impl/dtype/mode/label``."""
        return "/".join((self.case.op, self.impl.name, self.case.dtype, self.mode, self.entry.label))


@dataclass(frozen=True)
class Grid:
    """The points to run on one device, and the implementations left out with the reason."""

    points: tuple[Point, ...]
    unavailable: tuple[tuple[str, str, str], ...]   # (op, impl, why)
    identity: dict

    @property
    def hash(self) -> str:
        return grid_hash(self.identity)


def _seed(op: str, label: str) -> int:
    """A fixed seed per op and case label (the same for every dtype: the fp32 and bf16 cases round
    the same draws)."""
    return zlib.crc32(f"{op}/{label}".encode()) & 0x7FFFFFFF


# Templates: each returns (base, sweep), lists of (label, dims, keyword arguments of Case.make other
# than dtype and seed). Sizes are small (the CPU runs Triton interpreted) but cover what kernels get
# wrong: several batch rows and heads, GQA, a partial chunk, a sequence across a chunk boundary, an
# empty packed sequence. The sweep is one sequence per length.
Templates = tuple[list[tuple[str, dict, dict]], list[tuple[str, dict, dict]]]


def _sweep_lengths(quick: bool) -> tuple[int, ...]:
    return QUICK_SWEEP_T if quick else SWEEP_T


def _linear_templates(op: str, quick: bool) -> Templates:
    """kda, gla, simple_gla: a dense batch (one partial chunk) with initial and final states, packed
    sequences (an empty one, one across a chunk boundary), and for kda the in-kernel safe gate; the
    sweep returns the final state too."""
    final = {"output_final_state": True}
    if quick:
        base = [("dense", dict(B=1, T=24, H=1, K=8, V=8), dict(options=final, draw={"initial_state": True}))]
    else:
        dims = dict(H=2, K=16, V=24)
        base = [("dense", dict(dims, B=2, T=40), dict(options=final, draw={"initial_state": True})),
                ("varlen", dict(dims, B=1, T=97),
                 dict(seqlens=(17, 0, 80), draw={"initial_state": True},
                      options=dict(final, use_qk_l2norm=True) if op == "kda" else final)),
                # what kernels get wrong: a state leaking between packed sequences or batch rows (no
                # initial state to reset to), a partial last chunk of one token (T = 65), steep decay
                # over a partial last chunk
                ("varlen_no_h0", dict(dims, B=1, T=100), dict(seqlens=(35, 0, 65), options=final)),
                ("chunk_plus_one", dict(dims, B=2, T=65), dict(options=final)),
                ("steep_partial", dict(dims, B=1, T=70),
                 dict(options=final, draw={"initial_state": True, "normalizer": 0.1}))]
        if op == "kda":
            base.append(("gate_in_kernel", dict(dims, B=1, T=40),
                         dict(options=dict(final, use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0))))
    sweep_dims = dict(B=1, H=1, K=8, V=8) if quick else dict(B=1, H=1, K=16, V=16)
    return base, [(f"T={t}", dict(sweep_dims, T=t), dict(options=final)) for t in _sweep_lengths(quick)]


def _gate_templates(op: str, quick: bool) -> Templates:
    """kda_gate: the softplus form and the lower-bound (sigmoid) form; elementwise, so no sweep."""
    dims = dict(B=1, T=16, H=1, K=8) if quick else dict(B=2, T=33, H=2, K=16)
    base = [("dense", dims, {})]
    if not quick:
        base.append(("lower_bound", dims, dict(options={"lower_bound": -5.0})))
    return base, []


def _attention_templates(op: str, quick: bool) -> Templates:
    """attention: causal GQA batch with more queries than keys (its first rows see no key); packed
    non-causal sequences (one empty query span); causal sweep with S = T."""
    if quick:
        base = [("dense", dict(B=1, T=12, S=16, H=2, Hk=1, Dqk=16, Dv=8), dict(options={"causal": True}))]
    else:
        dims = dict(T=40, S=50, H=4, Hk=2, Dqk=32, Dv=24)
        base = [("dense", dict(dims, B=2, T=50, S=40), dict(options={"causal": True})),
                ("varlen", dict(dims, B=1), dict(seqlens=(13, 0, 27), seqlens_k=(20, 5, 25)))]
    sweep_dims = dict(B=1, H=2, Hk=1, Dqk=16, Dv=8) if quick else dict(B=1, H=2, Hk=1, Dqk=32, Dv=32)
    return base, [(f"T={t}", dict(sweep_dims, T=t, S=t), dict(options={"causal": True}))
                  for t in _sweep_lengths(quick)]


TEMPLATES = {"kda_gate": _gate_templates, "kda": _linear_templates, "gla": _linear_templates,
             "simple_gla": _linear_templates, "attention": _attention_templates}
"""How each op's grid cases are made; every op card needs an entry (checked in ``cases``)."""


def cases(op: str, quick: bool = False) -> list[GridCase]:
    """Every grid case of ``op``: base cases then the sweep, each for every dtype of the op card."""
    op_card = card(op)
    if op not in TEMPLATES:
        raise ValueError(f"op: {op!r} has no grid cases; add a template to refcheck.grid.TEMPLATES")
    base, sweep = TEMPLATES[op](op, quick)
    return [GridCase(label, Case.make(op, dims, dtype, _seed(op, label), **kw), is_sweep)
            for dtype in op_card.dtypes
            for templates, is_sweep in ((base, False), (sweep, True))
            for label, dims, kw in templates]


def identity(ops: list[str], impls: list[str] | None, quick: bool) -> dict:
    """The grid definition as plain data: version, filters and every case (``Case.to_python``)."""
    return {"version": GRID_VERSION, "quick": quick, "ops": list(ops),
            "impls": None if impls is None else sorted(impls),
            "cases": [[e.label, e.sweep, e.case.to_python()] for op in ops for e in cases(op, quick)]}


def grid_hash(ident: dict) -> str:
    """SHA-256 of the canonical JSON of a grid identity."""
    return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def build(device: str, *, ops: list[str] | None = None, impls: list[str] | None = None,
          quick: bool = False, dtypes: tuple[str, ...] | None = None) -> Grid:
    """The grid's points for ``device``.

    ops:   op names (default: every op card); impls: implementation names to keep (default: all);
    quick: the small grid (one base case per op and dtype, a short sweep) for tests and smoke runs;
    dtypes: only points of these input dtypes (the cases, and so the grid's identity, stay whole).
    Implementations that cannot run on ``device`` are listed in ``unavailable`` with the reason.
    Points are ordered case by case, so that the float64 truth of a case is computed once.
    """
    if ops is not None:
        for op in ops:
            card(op)
    ops = [op for op in OPS if ops is None or op in ops]   # op-card order: the same grid, the same hash
    if impls is not None:
        known = {i.name for op in ops for i in registry.implementations(op)}
        unknown = sorted(set(impls) - known)
        if unknown:
            raise ValueError(f"impls: {', '.join(unknown)} not registered for {', '.join(ops)}; "
                             f"registered: {', '.join(sorted(known))}")
    points, unavailable = [], []
    for op in ops:
        runnable = []
        for impl in registry.implementations(op):
            if impls is not None and impl.name not in impls:
                continue
            why = impl.unavailable(device)
            if why is None:
                runnable.append(impl.on(device))
            else:
                unavailable.append((op, impl.name, why))
        for entry in cases(op, quick):
            if dtypes and entry.case.dtype not in dtypes:
                continue
            points += [Point(impl, mode, entry) for impl in runnable if entry.case.dtype in impl.dtypes
                       for mode in impl.modes]
    return Grid(tuple(points), tuple(unavailable), identity(ops, impls, quick))


@contextmanager
def threads(device: str) -> Iterator[None]:
    """Run the grid on the CPU with one intra-op thread (restored afterwards).

    Grid tensors are tiny, so threads only add synchronisation: on 2 busy cores the float64
    sweep truths took 44 s with 2 threads and 9 s with one. One thread also makes the measured
    errors independent of the machine's core count (reductions split the same way everywhere).
    """
    if device != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
