"""The fixed, seeded verification grid: what ``refcheck report`` tables and ``refcheck drift`` records.

For every op the grid holds a few *base* cases (a dense batch and packed sequences, with the op's
main options) and a *sweep*: one dense case per sequence length ``T`` (``refcheck.model.ops.card.SWEEP_T``),
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

import functools
import hashlib
import json
import math
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model import registry
from ..model.case import Case
from ..model.ops import OPS, card
from ..runtime.workers import Unit

GRID_VERSION = 9
"""Bump when a case of the grid changes: records of another version are refused by ``compare``."""

@dataclass(frozen=True)
class GridCase:
    """One case of the grid; ``label`` names it within its op and dtype ("dense", "T=256")."""

    label: str
    case: Case
    sweep: bool = False
    devices: tuple[str, ...] | None = None     # the device types it runs on (None: every one)

    def runs_on(self, device: str) -> bool:
        return self.devices is None or torch.device(device).type in self.devices

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
    declined: tuple[tuple[str, str, str, int], ...] = ()   # (op, impl, extension, grid cases not run)
    outside: tuple[tuple[str, str, int], ...] = ()          # (op, impl, grid cases outside its head dims)

    @property
    def hash(self) -> str:
        return grid_hash(self.identity)


def _seed(op: str, label: str) -> int:
    """A fixed seed per op and case label (the same for every dtype: the fp32 and bf16 cases round
    the same draws)."""
    return zlib.crc32(f"{op}/{label}".encode()) & 0x7FFFFFFF


def cases(op: str, quick: bool = False) -> list[GridCase]:
    """Every grid case of ``op``: base cases then the sweep, each for every dtype of the op card."""
    op_card = card(op)
    if op_card.grid is None:
        raise ValueError(f"op: {op!r} has no grid cases; give its card a grid (refcheck.model.ops.OpCard.grid)")
    base, sweep = op_card.grid(quick)
    return [GridCase(label, Case.make(op, dims, dtype, _seed(op, label), **{k: v for k, v in kw.items() if k != "devices"}),
                     is_sweep, kw.get("devices"))
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
    Implementations that cannot run on ``device`` are listed in ``unavailable`` with the reason, the
    cases of extensions an implementation declines (``OpCard.declined``) in ``declined``, the cases
    outside an implementation's head dims (``Implementation.outside_dims``) in ``outside``; a case
    whose template names its devices (``devices``: a GPU-sized case) is left out elsewhere.
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
    declined: dict[tuple[str, str, str], int] = {}
    outside: dict[tuple[str, str], int] = {}
    for op in ops:
        op_card = card(op)
        runnable = []
        for impl in registry.implementations(op):
            if impls is not None and impl.name not in impls:
                continue
            why = impl.unavailable(device)
            if why is None:
                runnable.append(impl.on(device))
            else:
                unavailable.append((op, impl.name, why))
        declines = {impl.name: op_card.declined(impl) for impl in runnable}
        for entry in cases(op, quick):
            if (dtypes and entry.case.dtype not in dtypes) or not entry.runs_on(device):
                continue
            for impl in runnable:
                if entry.case.dtype not in impl.dtypes:
                    continue
                if impl.outside_dims(entry.case):
                    outside[(op, impl.name)] = outside.get((op, impl.name), 0) + 1
                    continue
                left_out = op_card.uses_declined(entry.case, declines[impl.name])
                for name in left_out:   # a case of an extension the implementation declines: not run
                    declined[(op, impl.name, name)] = declined.get((op, impl.name, name), 0) + 1
                if not left_out:
                    points += [Point(impl, mode, entry) for mode in impl.modes]
    return Grid(tuple(points), tuple(unavailable), identity(ops, impls, quick),
                tuple((*key, n) for key, n in declined.items()), tuple((*key, n) for key, n in outside.items()))


# --- running the points: one runner for report and drift ------------------------------------------

PointOutcome = tuple  # (Verdict | None, crash: str | None, seconds: float)


def run_points(points: list[Point], device: str) -> list[PointOutcome]:
    """Verify every point (all of one case: the float64 truth is computed once, then cached); per
    point ``(verdict, None, seconds)`` or ``(None, crash, seconds)``: what the implementation (or the
    check) raised, with the last frames of its traceback. A crash is a finding, not a crash of the
    run."""
    from .verify import verify

    results: list[PointOutcome] = []
    for point in points:
        started = time.perf_counter()
        try:
            verdict, crash = verify(point.impl, point.case, mode=point.mode, device=device), None
        except Exception as err:  # a finding: reported with its reproducer
            tb = "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-4))
            verdict, crash = None, f"{type(err).__name__}: {err}\n{tb.rstrip()}"
        results.append((verdict, crash, time.perf_counter() - started))
    return results


def weight(impl, case: Case) -> float:
    """Rough cost of one run: interpreted Triton kernels are ~100x the torch references; on a GPU
    a kernel's first run compiles it (a peer's too), so those units start first."""
    return math.prod(v for _, v in case.dims) * (100.0 if impl.triton or impl.requires else 1.0)


def _crashed(message: str, n: int) -> list[PointOutcome]:
    """The outcomes of ``n`` points whose worker process died with ``message``."""
    return [(None, message, 0.0)] * n


def point_units(points: list[Point], result: Callable[..., object]) -> list[Unit]:
    """The points as units of work (``runtime.workers``), grouped by case and implementation: its
    modes share the float64 truth, and an implementation that kills its process takes only its own
    points with it. Each point's outcome becomes ``result(point, verdict, crash, seconds)``."""
    groups: dict = {}
    for p in points:
        groups.setdefault((p.case, p.impl.name), []).append(p)

    def wrap(outcomes, points):
        return [result(p, *outcome) for p, outcome in zip(points, outcomes)]
    return [Unit(f"{c.op} {c.dtype} {ps[0].entry.label} {name}", run_points, (ps,),
                 sum(weight(p.impl, c) for p in ps), functools.partial(wrap, points=ps),
                 crashed=functools.partial(_crashed, n=len(ps)), group=f"{c.op}/{name}")
            for (c, name), ps in groups.items()]
