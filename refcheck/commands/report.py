"""``refcheck report``: the verification report, the main job.

Two parts, both run on the default device (the GPU, else the CPU with the faithful Triton
interpreter), both through the one pipeline (``refcheck.engine.verify``; the laws through ``laws.check``):

* the *error table*: every base case of the seeded grid (``refcheck.engine.grid``; the error-growth sweep
  is ``drift``'s) for every op x available implementation x dtype x precision mode, each output's
  relative RMS error against the float64 truth, its budget (``tolerances.toml``) and the headroom
  ``budget / error``. A table per op, a row per (implementation, dtype, mode), a column per output:
  each cell shows the worst case (least headroom) and how many cases failed; every failing case is
  listed below the tables with a reproducer.
* the *law summary*: every law of ``refcheck.engine.laws.LAWS`` that applies to an implementation, run on
  the first base case of the grid that meets the law's requirements (no Hypothesis: the same fixed
  cases every time), one law parameter value per case (``FIXED_PARAMS``).

Units of work (the points of one case, or one law on one case) run in worker processes on the CPU
(``--jobs``, default up to 4; interpreted kernels are single-threaded). Implementations that cannot
run here are listed with the reason, not failed. Exit status 1 when an output is over budget, an
implementation broke its contract or a law, else 0; 2 for usage errors.
"""
from __future__ import annotations

import functools
import json
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runtime.workers import MAX_GPU_JOBS, MAX_JOBS, Interrupted, Unit, default_jobs, execute
from .cli import UsageError

if TYPE_CHECKING:
    from ..engine.examples import Example
    from ..engine.grid import Point
    from ..engine.laws import Law
    from ..engine.verify import Measurement, Verdict
    from ..model.implementation import Implementation

FORMAT = "refcheck-report"
FORMAT_VERSION = 1

"""Default worker processes on the CPU (capped by the cores available): beyond this the longest
single unit (a law on an interpreted kernel) bounds the wall time anyway."""

# --- units of work --------------------------------------------------------------------------------

@dataclass
class PointResult:
    """One grid point: its verdict, or the exception the implementation (or the check) raised."""

    point: Point
    verdict: Verdict | None = None
    crash: str | None = None
    seconds: float = 0.0      # the first point of a case includes computing its float64 truth

    @property
    def passed(self) -> bool:
        return self.crash is None and self.verdict is not None and self.verdict.passed

    def reproducer(self, device: str = "cpu") -> str:
        from ..engine.verify import Verdict
        p = self.point
        return (self.verdict or Verdict(p.case.op, p.impl.name, p.case, p.mode, {}, record=p.impl)).reproducer(device)


@dataclass
class LawResult:
    """One law on one implementation: ``holds`` (``notes``: bitwise differences within budget),
    ``FAILS`` (``detail``: the violation and its reproducer), ``n/a`` or ``no case`` (``detail``: why)."""

    law: Law
    impl: Implementation
    status: str
    example: Example | None = None
    detail: str | None = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == "FAILS"


def run_law(law_name: str, impl, example, device: str) -> tuple[str, str, list[str], float]:
    """One law on one example (``laws.check``): ``(status, detail, notes, seconds)``; any
    exception is a failure of the law."""
    from ..engine.laws import LAWS, LawViolation, check

    law = LAWS[law_name]
    started = time.perf_counter()
    try:
        status, detail, notes = "holds", "", check(law, impl, example, device=device, strict=False).notes
    except LawViolation as err:
        status, detail, notes = "FAILS", str(err), []
    except Exception as err:
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-6))
        status, notes = "FAILS", []
        detail = (f"law {law.name} on {impl.op}/{impl.name}: the check raised {type(err).__name__}: {err}\n"
                  f"  case: {example.case.describe()}\n{tb.rstrip()}")
    return status, detail, notes, time.perf_counter() - started


def law_plan(impls: list, quick: bool, device: str = "cpu") -> tuple[list[Unit], list[LawResult]]:
    """For every implementation and law: a unit running the law on its first matching base case
    (in the implementation's first precision mode and default knobs), or why it is not run."""
    from ..engine import grid
    from ..engine.examples import Example, meets
    from ..engine.laws import LAWS, fixed_params, path_knobs
    from ..model.ops import card

    units, skipped = [], []
    for impl in impls:
        op_card, declined = card(impl.op), card(impl.op).declined(impl)
        entries = [e for e in grid.cases(impl.op, quick) if not e.sweep and e.case.dtype in impl.dtypes
                   and e.runs_on(device) and not impl.outside_dims(e.case)
                   and not op_card.uses_declined(e.case, declined)]
        for law in LAWS.values():
            if law.why_not(impl) is not None:
                if impl.op in law.ops:
                    skipped.append(LawResult(law, impl, "n/a", detail=law.why_not(impl)))
                continue
            entry = next((e for e in entries if meets(e.case, law.requires)), None)
            if entry is None:
                need = ", ".join(f"{k}={v}" for k, v in law.requires.items())
                skipped.append(LawResult(law, impl, "no case", detail=f"no base case of the grid meets {need}"))
                continue
            example = Example(entry.case, impl.modes[0], path_knobs(impl)[0], fixed_params(law, entry.case))

            def wrap(result, law=law, impl=impl, example=example):
                return [LawResult(law, impl, result[0], example, *result[1:])]
            units.append(Unit(f"{law.name} {impl.op}/{impl.name}", run_law, (law.name, impl, example),
                              law.cost * grid.weight(impl, entry.case), wrap,
                              crashed=functools.partial(_law_crash, law, impl, example), group=f"{impl.op}/{impl.name}"))
    return units, skipped


def _law_crash(law, impl, example, message: str) -> tuple:
    """The result of a law check whose process died: it FAILS, with the case and its reproducer."""
    from ..engine.laws import Trial
    trial = Trial(law, impl, example.case, example.mode, dict(example.knobs), dict(example.params))
    return "FAILS", f"{message}\n  case: {example.case.describe()}\n  reproduce: {trial.reproducer()}", [], 0.0


# --- rendering ------------------------------------------------------------------------------------

def _num(x: float) -> str:
    return "inf" if x == math.inf else f"{x:.1e}"


def _headroom(x: float) -> str:
    if x == math.inf:
        return "exact"
    return f"{x:.0f}x" if x >= 10 else f"{x:.2f}x"


@dataclass
class Cell:
    """One output of one (op, implementation, dtype, mode) over the grid's cases: the worst case
    (least headroom) and how many cases passed."""

    worst: Measurement | None = None
    cases: int = 0
    passed: int = 0

    def add(self, m) -> None:
        self.cases += 1
        self.passed += m.passed
        if self.worst is None or m.headroom < self.worst.headroom:
            self.worst = m

    def render(self) -> str:
        m = self.worst
        assert m is not None    # a cell is made by adding its first measurement
        text = f"{_num(m.error)}\n/{_num(m.bound)}\n{_headroom(m.headroom)}"
        if self.passed == self.cases:
            return f"[green]{text}[/]"
        return f"[bold red]{text}\nFAIL {self.cases - self.passed}/{self.cases}[/]"


def error_cells(results: list[PointResult]) -> dict:
    """``{op: {(impl, dtype, mode): {output: Cell}}}`` over the verified points (crashes are listed
    with the failures)."""
    cells: dict = {}
    for r in results:
        if r.crash is not None:
            continue
        p = r.point
        row = cells.setdefault(p.case.op, {}).setdefault((p.impl.name, p.case.dtype, p.mode), {})
        assert r.verdict is not None    # no crash: the point was verified
        for m in r.verdict.measurements:
            row.setdefault(m.output, Cell()).add(m)
    return cells


def error_tables(results: list[PointResult]) -> list:
    """A rich table per op: a row per (implementation, dtype, mode), a column per output; each cell
    holds the worst error over the cases / its budget, and the headroom (budget / error)."""
    from rich.table import Table

    from ..model.ops import card

    tables = []
    for op, rows in error_cells(results).items():
        outputs = [n for n in card(op).budget_outputs if any(n in row for row in rows.values())]
        t = Table(title=f"{op}: worst error / budget, headroom", title_justify="left")
        for col in ("impl", "dtype", "mode"):
            t.add_column(col)
        for name in outputs:
            t.add_column(name, justify="right")
        for (impl, dtype, mode), row in rows.items():
            t.add_row(impl, dtype, mode, *(row[n].render() if n in row else "-" for n in outputs))
        tables.append(t)
    return tables


LAW_CELLS = {"holds": "[green]ok[/]", "FAILS": "[bold red]FAIL[/]", "n/a": "[dim]n/a[/]",
             "no case": "[yellow]none[/]"}


def law_table(laws_run: list[LawResult], impls: list):
    """Implementations (rows) by law (columns, numbered in the caption's legend): ok (holds), ok*
    (within budget, not bitwise), FAIL, n/a (does not apply), none (no base case meets its
    requirements); blank: the law does not concern the op. Rows stay readable however many
    implementations there are."""
    from rich.table import Table

    from ..engine.laws import LAWS

    cells = {(r.law.name, r.impl.op, r.impl.name): r for r in laws_run}
    legend = ", ".join(f"{i} {law.name}" for i, law in enumerate(LAWS.values(), 1))
    t = Table(title="laws on fixed grid cases", title_justify="left", caption_justify="left",
              caption=f"{legend}\nok*: within budget, not bitwise; n/a: does not apply; none: no grid case meets "
                      "its requirements; blank: the law does not concern the op")
    t.add_column("op")
    t.add_column("impl")
    for i, _ in enumerate(LAWS.values(), 1):
        t.add_column(str(i), justify="center")
    for impl in impls:
        row = []
        for law in LAWS.values():
            r = cells.get((law.name, impl.op, impl.name))
            cell = "" if r is None else LAW_CELLS[r.status]
            row.append(cell.replace("ok", "ok*") if r is not None and r.notes else cell)
        t.add_row(impl.op, impl.name, *row)
    return t


def point_json(r: PointResult, device: str) -> dict:
    from .drift import encode_float

    p = r.point
    entry = {"id": p.id, "op": p.case.op, "impl": p.impl.name, "dtype": p.case.dtype, "mode": p.mode,
             "label": p.entry.label, "case": p.case.to_python(), "passed": r.passed, "crash": r.crash,
             "problems": [], "outputs": {}, "reproduce": r.reproducer(device), "seconds": round(r.seconds, 3)}
    if r.verdict is not None:
        entry["problems"] = list(r.verdict.problems)
        entry["outputs"] = {m.output: {"error": encode_float(m.error), "bound": encode_float(m.bound),
                                       "headroom": encode_float(m.headroom), "passed": m.passed,
                                       "budget": m.budget.key, "metric": m.budget.metric, "made_of": m.explanation}
                            for m in r.verdict.measurements}
    return entry


def law_json(r: LawResult) -> dict:
    entry: dict[str, Any] = {"law": r.law.name, "number": r.law.number, "op": r.impl.op, "impl": r.impl.name,
                             "status": r.status, "detail": r.detail, "notes": r.notes, "case": None,
                             "seconds": round(r.seconds, 3)}
    if r.example is not None:
        entry.update(case=r.example.case.to_python(), mode=r.example.mode, knobs=r.example.knobs,
                     params=r.example.params)
    return entry


def time_by_impl(points: list[PointResult], laws_run: list[LawResult]) -> dict[str, tuple[float, float]]:
    """Seconds spent per ``op/impl`` on grid points and on laws, largest total first."""
    spent: dict[str, list[float]] = {}
    for r in points:
        spent.setdefault(f"{r.point.case.op}/{r.point.impl.name}", [0.0, 0.0])[0] += r.seconds
    for lr in laws_run:
        spent.setdefault(f"{lr.impl.op}/{lr.impl.name}", [0.0, 0.0])[1] += lr.seconds
    return {k: (v[0], v[1]) for k, v in sorted(spent.items(), key=lambda kv: -sum(kv[1]))}


# --- command line ---------------------------------------------------------------------------------

def add_parser(subparsers) -> None:
    from .selection import add_options

    p = subparsers.add_parser("report", help="the verification report: errors against budgets on the seeded grid, "
                                             "and which laws hold for which implementation",
                              description=__doc__.split("\n\n")[0].replace("``", ""))
    add_options(p)
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the whole report as JSON")
    p.add_argument("--quick", action="store_true", help="the small grid (one tiny case per op and dtype)")
    p.add_argument("--no-laws", dest="laws", action="store_false", help="skip the law summary")
    p.add_argument("--jobs", type=int, default=None,
                   help=f"worker processes (default: the cores available, at most {MAX_JOBS} on the CPU, "
                        f"{MAX_GPU_JOBS} on a GPU)")
    p.set_defaults(run=run)


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape

    from .. import __version__
    from ..engine import grid
    from ..model.ops import card
    from .selection import SelectionError, select

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs: expected a positive count, got {args.jobs}")
    if args.json is not None and not args.json.parent.is_dir():
        raise UsageError(f"--json: folder {args.json.parent} does not exist")
    try:
        selection = select(impls=args.impl, ops=args.op, dtypes=args.dtype, budgets=args.budgets,
                           device=args.device, forward_only=args.forward_only, op_cards=args.op_card)
        device = selection.device
        names = [i.name for i in selection.named] or None
        the_grid = grid.build(device, ops=list(selection.ops) or None, impls=names, quick=args.quick,
                              dtypes=selection.dtypes or None)
    except (SelectionError, ValueError) as err:
        raise UsageError(str(err)) from None
    jobs = args.jobs or default_jobs(device)
    started = time.perf_counter()

    console = Console(highlight=False, width=max(Console().width, 150))
    points = [p for p in the_grid.points if not p.entry.sweep]
    impls = list({(p.impl.op, p.impl.name): p.impl for p in points}.values())
    units = grid.point_units(points, PointResult)
    law_units: list[Unit] = []
    laws_skipped: list[LawResult] = []
    if args.laws:
        law_units, laws_skipped = law_plan(impls, args.quick, device)
        units += law_units
    console.print(f"refcheck {__version__} report on {device}"
                  + (" (Triton kernels run in the faithful interpreter)" if device == "cpu" else "")
                  + f": {len(points)} grid points, {len(law_units)} law checks, {jobs} "
                  + ("worker" if jobs == 1 else "workers"))
    try:
        done, unfinished = execute(units, device, jobs, Console(stderr=True), "report"), []
    except Interrupted as stop:       # a time limit: report what finished, and what did not
        done, unfinished = stop.results, stop.unfinished
    point_results = [r for r in done if isinstance(r, PointResult)]
    laws_run = [r for r in done if isinstance(r, LawResult)] + laws_skipped
    elapsed = time.perf_counter() - started

    for table in error_tables(point_results):
        console.print(table)
    for op, impl_name, why in the_grid.unavailable:
        console.print(f"not run: {op} {escape(f'[{impl_name}]')}: {escape(why)}")
    for op, impl_name, n in the_grid.outside:
        console.print(f"outside its head dims: {op} {escape(f'[{impl_name}]')}: {n} grid case(s) not run")
    for op, impl_name, extension, n in the_grid.declined:
        console.print(f"declined: {op} {escape(f'[{impl_name}]')}: extension {extension} "
                      f"({escape(card(op).extension(extension).meaning)}): {n} grid case(s) not run")
    for impl in impls:
        if impl.forward_only_because:
            console.print(f"forward only: {impl.op} {escape(f'[{impl.name}]')}: {escape(impl.forward_only_because)}")
    if args.laws:
        console.print(law_table(laws_run, impls))
        for r in laws_run:
            for note in r.notes:
                console.print(f"  ok*: {escape(note)}", soft_wrap=True)
            if r.status == "no case":
                assert r.detail is not None     # a "no case" result says why
                console.print(f"  none: {r.law.name} on {r.impl.op}/{r.impl.name}: {escape(r.detail)}", soft_wrap=True)

    failed_points = [r for r in point_results if not r.passed]
    failed_laws = [r for r in laws_run if r.failed]
    for pr in failed_points:
        console.print(f"\n[bold red]FAIL[/] {escape(pr.point.id)}")
        if pr.crash is None:
            assert pr.verdict is not None   # no crash: the point was verified
            message = pr.verdict.failure_message(device)
        else:
            message = f"  raised {pr.crash}\n  case: {pr.point.case.describe()}\n  reproduce: {pr.reproducer(device)}"
        console.print(message, markup=False, soft_wrap=True)
    for r in failed_laws:
        console.print(f"\n[bold red]law {r.law.name} FAILS[/] for {r.impl.op}/{escape(r.impl.name)}")
        console.print(r.detail, markup=False, soft_wrap=True)

    outputs = sum(len(r.verdict.measurements) for r in point_results if r.verdict is not None)
    summary = {"points": len(point_results), "points_failed": len(failed_points), "outputs": outputs,
               "law_checks": len([r for r in laws_run if r.example is not None]), "laws_failed": len(failed_laws),
               "seconds": round(elapsed, 1), "jobs": jobs, "unfinished": len(unfinished)}
    passed = not failed_points and not failed_laws and not unfinished
    if args.json is not None:
        from .drift import environment, write_atomic
        report = {"format": FORMAT, "format_version": FORMAT_VERSION, "passed": passed, "summary": summary,
                  "environment": environment(device),
                  "grid": {**{k: v for k, v in the_grid.identity.items() if k != "cases"}, "hash": the_grid.hash},
                  "unavailable": [{"op": op, "impl": impl, "why": why} for op, impl, why in the_grid.unavailable],
                  "points": [point_json(r, device) for r in point_results], "laws": [law_json(r) for r in laws_run],
                  "unfinished": unfinished}
        write_atomic(args.json, json.dumps(report, indent=1, allow_nan=False) + "\n")
    console.print("\nwall seconds in workers per implementation (grid + laws): " + ", ".join(
        f"{name} {grid_s + law_s:.0f} s ({grid_s:.0f} + {law_s:.0f})"
        for name, (grid_s, law_s) in time_by_impl(point_results, laws_run).items()), soft_wrap=True)
    if unfinished:
        console.print(f"\n[bold red]INTERRUPTED[/]: {len(unfinished)} of {len(units)} units did not finish: "
                      + escape(", ".join(unfinished)), soft_wrap=True)
    verdict = "[bold green]PASS[/]" if passed else "[bold red]INCOMPLETE[/]" if unfinished and not (
        failed_points or failed_laws) else "[bold red]FAIL[/]"
    console.print(f"\n{verdict}: {len(point_results) - len(failed_points)}/{len(point_results)} grid points within "
                  f"budget ({outputs} outputs), {summary['law_checks'] - len(failed_laws)}/{summary['law_checks']} "
                  f"law checks hold; {elapsed:.0f} s on {device} with {jobs} "
                  + ("worker" if jobs == 1 else "workers") + (f"; JSON: {escape(str(args.json))}" if args.json else ""),
                  soft_wrap=True)
    return 0 if passed else 1
