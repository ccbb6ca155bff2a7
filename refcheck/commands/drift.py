"""``refcheck drift``: record the grid's measured errors, and compare two records.

``drift record --out FILE`` runs every point of the seeded grid (``refcheck.engine.grid``) through
``refcheck.engine.verify.verify`` (the one error path) and writes, per point, each output's error, bound
and budget key, with the environment, as JSON. The file holds nothing volatile (no timestamps, no
timings), so two records of the same code on the same device are byte-identical; it is written to
a temporary file and moved into place, so a killed run leaves no half file.

``drift compare BASE HEAD`` (``refcheck.commands.drift_compare``) lines the two records up point by point.
Records of other grids, other record formats or other devices are refused with the difference named.
"""
from __future__ import annotations

import functools
import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path

from .. import __version__
from ..engine import grid
from ..engine.verify import Verdict, verify
from ..runtime.workers import Unit, default_jobs, execute
from .cli import UsageError

FORMAT = "refcheck-drift-record"
FORMAT_VERSION = 1
"""Bump when the layout of a record changes; older records are then refused by ``load``."""

IDENTITY_ENV = ("device", "interpreted")
"""Environment fields two compared records must share: errors on another device are another grid."""


class RecordError(ValueError):
    """A record file that cannot be used: unreadable, corrupt, truncated, or of another grid."""


# --- numbers in JSON -------------------------------------------------------------------------------

def encode_float(x: float) -> float | str:
    """JSON has no inf/nan: those are written as the strings "inf", "-inf", "nan"."""
    return x if math.isfinite(x) else str(x)


def decode_float(x) -> float:
    """The inverse of ``encode_float``; ``TypeError`` for anything that is not a number."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) or x in ("inf", "-inf", "nan"):
        return float(x)
    raise TypeError(f"expected a number, got {x!r}")


# --- recording -------------------------------------------------------------------------------------

def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(device: str) -> dict:
    """Versions, refcheck's git revision (and whether tracked files differ from it), the device."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    status = _git("status", "--porcelain", "--untracked-files=no")
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        device_name = f"{props.name} (sm_{props.major}{props.minor})"
    else:
        device_name = platform.machine()
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton_version,
            "refcheck": __version__, "git_revision": _git("rev-parse", "HEAD"),
            "git_dirty": None if status is None else bool(status), "device": device, "device_name": device_name,
            "interpreted": device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"}


def record_point(point: grid.Point, device: str) -> dict:
    """One point of a record: each output's error and bound, contract problems, or the exception
    the implementation raised (a broken implementation is a finding, not a crash of the record)."""
    crash = None
    try:
        verdict = verify(point.impl, point.case, mode=point.mode, device=device)
    except Exception as err:  # recorded, compared, and shown with its reproducer
        lines = [line.strip() for line in f"{type(err).__name__}: {err}".splitlines() if line.strip()]
        crash = " ... ".join(dict.fromkeys([lines[0], lines[-1]]))   # a compiler's message ends with its cause
        verdict = None
    return point_entry(point, device, verdict, crash)


def point_entry(point: grid.Point, device: str, verdict, crash: str | None) -> dict:
    """A point of a record: the verdict's measurements, or the crash (``verdict`` None)."""
    verdict = verdict or Verdict(point.case.op, point.impl.name, point.case, point.mode, {}, record=point.impl)
    return {"id": point.id, "op": point.case.op, "impl": point.impl.name, "dtype": point.case.dtype,
            "mode": point.mode, "label": point.entry.label, "sweep": point.entry.sweep, "T": point.entry.length,
            "case": point.case.to_python(), "reproduce": verdict.reproducer(device), "crash": crash,
            "problems": list(verdict.problems),
            "outputs": {m.output: {"error": encode_float(m.error), "bound": encode_float(m.bound),
                                   "budget": m.budget.key, "metric": m.budget.metric, "made_of": m.explanation}
                        for m in verdict.measurements}}


def _record_points(points: list[grid.Point], device: str) -> list[dict]:
    """Record the points of one case (they share its float64 truth); runs in a worker."""
    return [record_point(p, device) for p in points]


def record(the_grid: grid.Grid, device: str, *, jobs: int = 1, console=None) -> dict:
    """Run every point of ``the_grid`` on ``device`` in ``jobs`` processes, with a progress bar on
    ``console``. The points of one case stay together (they share its float64 truth); each point is
    computed alone in one thread, so the record does not depend on ``jobs``."""
    groups: dict = {}
    for point in the_grid.points:
        groups.setdefault(point.case, []).append(point)
    units = [Unit(group[-1].id, _record_points, (group,), len(group), functools.partial(zip, group),
                  # mypy cannot infer a lambda whose default argument binds the loop's group against Callable[[str], ...]
                  crashed=lambda message, group=group: [point_entry(p, device, None, message) for p in group])  # type: ignore[misc]
             for group in groups.values()]
    results = {p.id: entry for p, entry in execute(units, device, jobs, console, "drift record")}
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "grid": {**{k: v for k, v in the_grid.identity.items() if k != "cases"}, "hash": the_grid.hash},
            "environment": environment(device),
            "unavailable": [{"op": op, "impl": impl, "why": why} for op, impl, why in the_grid.unavailable],
            "points": [results[p.id] for p in the_grid.points]}


def dumps(rec: dict) -> str:
    """The canonical text of a record (sorted keys; floats round-trip exactly)."""
    return json.dumps(rec, indent=1, sort_keys=True, allow_nan=False) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``:
    readers see the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --- reading ---------------------------------------------------------------------------------------

POINT_KEYS = {"id": str, "op": str, "impl": str, "dtype": str, "mode": str, "label": str, "sweep": bool,
              "T": int, "case": str, "reproduce": str, "outputs": dict, "problems": list}


def _check_point(i: int, p) -> None:
    if not isinstance(p, dict):
        raise TypeError(f"points[{i}] is not an object")
    for key, kind in POINT_KEYS.items():
        if not isinstance(p.get(key), kind):
            raise TypeError(f"points[{i}] ({p.get('id', '?')}): {key!r} missing or not {kind.__name__}")
    if p.get("crash") is not None and not isinstance(p["crash"], str):
        raise TypeError(f"points[{i}] ({p['id']}): 'crash' must be text or null")
    for name, m in p["outputs"].items():
        if not isinstance(m, dict) or not {"error", "bound", "budget", "metric"} <= set(m):
            raise TypeError(f"points[{i}] ({p['id']}): output {name!r} lacks error/bound/budget/metric")
        m["error"], m["bound"] = decode_float(m["error"]), decode_float(m["bound"])


def load(path: str | Path) -> dict:
    """Read and validate a record; a clear ``RecordError`` for a missing, truncated, corrupt or
    foreign file, or one written by another record format."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(f"{path}: cannot read the drift record: {err}") from None
    if not text.strip():
        raise RecordError(f"{path}: empty file, not a drift record (an interrupted copy?)")
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as err:
        # A record ends with its closing brace: a file that does not was cut short.
        what = ("truncated: the JSON ends early" if not text.rstrip().endswith("}")
                else f"corrupt JSON at line {err.lineno}, column {err.colno}")
        raise RecordError(f"{path}: not a readable drift record ({what}: {err.msg}); record it again") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise RecordError(f"{path}: not a refcheck drift record (expected \"format\": \"{FORMAT}\")")
    if rec.get("format_version") != FORMAT_VERSION:
        raise RecordError(f"{path}: drift record format version {rec.get('format_version')!r}; this refcheck "
                          f"reads version {FORMAT_VERSION}: record both sides with the same refcheck")
    try:
        for key, kind in (("grid", dict), ("environment", dict), ("unavailable", list), ("points", list)):
            if not isinstance(rec.get(key), kind):
                raise TypeError(f"{key!r} missing or not a {kind.__name__}")
        if not isinstance(rec["grid"].get("hash"), str):
            raise TypeError("grid hash missing")
        if not isinstance(rec["environment"].get("device"), str) or \
                not isinstance(rec["environment"].get("interpreted"), bool):
            raise TypeError("environment lacks device/interpreted")
        if not all(isinstance(u, dict) and {"op", "impl", "why"} <= set(u) for u in rec["unavailable"]):
            raise TypeError("an 'unavailable' entry lacks op/impl/why")
        for i, p in enumerate(rec["points"]):
            _check_point(i, p)
    except TypeError as err:
        raise RecordError(f"{path}: malformed drift record: {err}") from None
    rec["path"] = str(path)
    return rec


def check_comparable(base: dict, head: dict) -> None:
    """Refuse records of different grids or devices, naming what differs."""
    gb, gh = base["grid"], head["grid"]
    if gb["hash"] != gh["hash"]:
        diffs = [f"{k}: {gb.get(k)!r} vs {gh.get(k)!r}" for k in ("version", "quick", "ops", "impls")
                 if gb.get(k) != gh.get(k)]
        detail = "; ".join(diffs) or "same options, but the grid's cases differ (refcheck/engine/grid.py or an op card changed)"
        raise RecordError(f"{base['path']} and {head['path']} were recorded on different grids "
                          f"({gb['hash'][:12]} vs {gh['hash'][:12]}: {detail}); record both with the same "
                          f"refcheck and the same drift record options")
    eb, eh = base["environment"], head["environment"]
    diffs = [f"{k}: {eb.get(k)!r} vs {eh.get(k)!r}" for k in IDENTITY_ENV if eb.get(k) != eh.get(k)]
    if diffs:
        raise RecordError(f"{base['path']} and {head['path']} were recorded on different devices "
                          f"({'; '.join(diffs)}): errors are only comparable on the same device")


# --- command line ----------------------------------------------------------------------------------

def add_parser(subparsers) -> None:
    from .selection import add_options

    p = subparsers.add_parser("drift", help="record the grid's errors; compare two records (pull request review)")
    sub = p.add_subparsers(dest="drift_command", required=True)

    rec = sub.add_parser("record", help="run the seeded grid and write every measured error to a JSON file")
    rec.add_argument("--out", required=True, type=Path, help="the record file to write (atomically)")
    add_options(rec)
    rec.add_argument("--quick", action="store_true", help="the small grid: one base case per op, short sweep")
    rec.add_argument("--jobs", type=int, default=None,
                     help="worker processes (default: the usable cores, at most 4 on the CPU, 8 on a GPU)")
    rec.set_defaults(run=run_record)

    cmp = sub.add_parser("compare", help="per case and output: error before and after, ratio, budget, headroom")
    cmp.add_argument("base", type=Path, help="record of the base revision")
    cmp.add_argument("head", type=Path, help="record of the head revision")
    cmp.add_argument("--threshold", type=float, default=None,
                     help="an error growing by more than this factor is a regression (default: 1.25)")
    cmp.add_argument("--markdown", action="store_true", help="print Markdown for a pull request comment")
    cmp.add_argument("--plots", type=Path, default=None, metavar="DIR",
                     help="write error-growth plots (PNG, error vs T, log-log) into DIR")
    cmp.add_argument("--plots-url", default=None, metavar="URL",
                     help="where the Markdown links the plots to (default: DIR as given)")
    cmp.add_argument("--all", action="store_true", help="list unchanged outputs too")
    cmp.set_defaults(run=run_compare)


def run_record(args) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    from .selection import SelectionError, select

    try:
        selection = select(impls=args.impl, ops=args.op, dtypes=args.dtype, budgets=args.budgets,
                           device=args.device, forward_only=args.forward_only, op_cards=args.op_card)
        device = selection.device
        the_grid = grid.build(device, ops=list(selection.ops) or None,
                              impls=[i.name for i in selection.named] or None, quick=args.quick,
                              dtypes=selection.dtypes or None)
    except (SelectionError, ValueError) as err:
        raise UsageError(str(err)) from None
    if not args.out.parent.is_dir():
        raise UsageError(f"--out: folder {args.out.parent} does not exist")
    jobs = args.jobs if args.jobs is not None else default_jobs(device)
    if jobs < 1:
        raise UsageError(f"--jobs: expected a positive number, got {jobs}")
    started = time.perf_counter()
    rec = record(the_grid, device, jobs=jobs, console=console)
    write_atomic(args.out, dumps(rec))
    outputs = sum(len(p["outputs"]) for p in rec["points"])
    crashed = sum(p["crash"] is not None for p in rec["points"])
    say = functools.partial(console.print, markup=False, highlight=False, soft_wrap=True)
    say(f"recorded {len(rec['points'])} points ({outputs} outputs, {crashed} crashed) of grid "
        f"{the_grid.hash[:12]} on {device} in {time.perf_counter() - started:.1f} s ({jobs} processes) -> {args.out}")
    for op, impl, why in the_grid.unavailable:
        say(f"  not run: {op} [{impl}]: {why}")
    return 0


def run_compare(args) -> int:
    from . import drift_compare

    threshold = drift_compare.DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    if not (threshold > 1 and math.isfinite(threshold)):
        raise UsageError(f"--threshold: expected a finite factor > 1, got {args.threshold}")
    try:
        base, head = load(args.base), load(args.head)
        check_comparable(base, head)
    except RecordError as err:
        raise UsageError(str(err)) from None
    result = drift_compare.compare(base, head, threshold)
    plots = []
    if args.plots is not None:
        from .plots import plot_growth

        plots = plot_growth(base, head, args.plots)
    links = [(op, mode, f"{(args.plots_url or str(args.plots)).rstrip('/')}/{path.name}") for op, mode, path in plots]
    if args.markdown:
        print(drift_compare.markdown(result, links))
    else:
        drift_compare.print_text(result, links, show_all=args.all)
    return 1 if result.regressions else 0
