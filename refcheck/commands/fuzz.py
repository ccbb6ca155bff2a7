"""``refcheck fuzz OP --impl module:callable``: hunt for a counterexample to every law, for a new kernel.

For every law of ``refcheck.engine.laws.LAWS`` that concerns OP and applies to the implementation,
Hypothesis draws examples (a case, a precision mode, every knob the implementation declares and the
law's own parameters: ``refcheck.engine.examples``) under the ``fuzz`` profile (``refcheck.strategies.profiles``)
and runs the law on each through ``laws.check``, the path every law and error of refcheck takes.
A falsified law is shrunk to a minimal example, printed with what broke (the measured error against
its budget, or the traceback of an implementation that raised on valid input), and written out as
a self-contained Python reproducer that raises while the bug is there. Failing examples are kept in
a Hypothesis example database (``.hypothesis/refcheck-fuzz``) and replayed first by the next run.

The callable must have the op's contract signature: that of its float64 reference
(``ops.card(OP).reference``), whose required arguments are passed by position and the rest by
keyword; a ``precision`` keyword, if it takes one, makes the precision mode a drawn knob.
Exit status: 0 nothing falsified, 1 a law falsified, 2 usage error, 3 some law ran no example in
``--seconds`` (nothing was tested there: never a green run).
"""
from __future__ import annotations

import dataclasses
import math
import os
import shlex
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .cli import UsageError

if TYPE_CHECKING:
    from ..engine.examples import Example
    from ..engine.laws import Law

DATABASE = Path(".hypothesis") / "refcheck-fuzz"
"""Where failing examples are kept (relative to the working directory unless ``--database``)."""

NOTHING_TESTED = 3
"""Exit status of a campaign in which some law ran no example (``--seconds`` spent, on a GPU often in compiling)."""

MIN_SHRINK_SECONDS = 30.0
"""With ``--seconds``, shrinking a counterexample found in time may take this long at least."""


# --- the implementation under test -----------------------------------------------------------------

# --- searching one law -----------------------------------------------------------------------------

@dataclass
class Failure:
    """A failing example, what it raised (a ``LawViolation``, or an exception of the check itself)
    and the text to print: the violation, or the exception with its traceback as it was raised."""

    example: Example
    error: BaseException
    text: str

    @classmethod
    def of(cls, example, error: BaseException) -> Failure:
        from ..engine.laws import LawViolation
        if isinstance(error, LawViolation):
            return cls(example, error, str(error))
        tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return cls(example, error, f"the check raised {type(error).__name__}: {error}\n{tb.rstrip()}")


@dataclass
class LawResult:
    """The outcome of searching one law: examples run, the minimal failure (if any), bitwise notes."""

    law: Law
    examples: int = 0
    shrink_runs: int = 0
    failure: Failure | None = None
    others: list[Failure] = field(default_factory=list)   # distinct failures beside ``failure``, each minimal
    flaky: bool = False
    out_of_time: bool = False
    notes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    search_seconds: float = 0.0   # until the first failure (the rest is shrinking)
    compiling_seconds: float = 0.0  # in examples during which Triton's cache grew (they compiled)
    crash: str | None = None      # the search's worker process died (a GPU kernel lost its CUDA context)
    warm_up: str | None = None    # what the law raised on a compile warm-up's example (GPU), or how it crashed

    def count_notes(self, outcome) -> None:
        """Count the bitwise notes of an example where the law held, one key per distinct check."""
        for line in outcome.notes:
            key = line.split(" (max abs diff")[0]
            self.notes[key] = self.notes.get(key, 0) + 1

    @property
    def found(self) -> bool:
        """A counterexample, a crash of the process searching (its example written down there), or a
        failure on a compile warm-up's example."""
        return self.failure is not None or self.crash is not None or self.warm_up is not None

    @property
    def status(self) -> str:
        if self.crash is not None:
            return "CRASHED"
        if self.failure is None and self.warm_up is not None:
            return "CRASHED in warm-up" if self.warm_up.startswith("crashed:") else "FALSIFIED in warm-up"
        if self.failure is not None:
            distinct = f" ({1 + len(self.others)} distinct)" if self.others else ""
            return "FALSIFIED" + distinct + (" (flaky: passed on replay)" if self.flaky else "")
        if not self.examples:
            return "not run (no time left)"
        return "holds" + (" (time limit)" if self.out_of_time else "")


@dataclass(frozen=True)
class Deadlines:
    """Wall-clock limits (``time.monotonic``) of one law: new examples until ``search``, shrinking a
    found counterexample until ``shrink``; ``inf`` without ``--seconds``."""

    search: float = math.inf
    shrink: float = math.inf

    @classmethod
    def after(cls, seconds: float | None) -> Deadlines:
        """Searching for ``seconds`` from now, then shrinking for as long again (at least
        ``MIN_SHRINK_SECONDS``); no limits for None."""
        if seconds is None:
            return cls()
        now = time.monotonic()
        return cls(now + seconds, now + seconds + max(seconds, MIN_SHRINK_SECONDS))


def _without_seed_hint(value) -> None:
    """Hypothesis' reporter, less "You can reproduce this failure by adding @seed(...)": it prints that
    whenever a run ends by an exception, ``_OutOfTime`` included, and a failure's reproducer here is
    refcheck's one-liner."""
    from hypothesis.reporting import default
    if "by adding @seed(" not in str(value):
        default(value)


class _OutOfTime(BaseException):
    """Ends a Hypothesis run at a deadline: a ``BaseException``, so Hypothesis lets it through (as it
    does Ctrl-C) instead of taking it for a failure to shrink."""


def search(law, impl, settings, *, limits, mode: str | None, device: str, strict: bool,
           deadlines: Deadlines = Deadlines(), seed: int | None = None, on_run=None,
           buckets: tuple = ()) -> LawResult:
    """Search for a counterexample to ``law`` on ``impl``: the law's fixed chunk-boundary examples
    first (``laws.boundary_examples``, already minimal; not with ``buckets``, whose examples stay in
    the compiled specializations, ``refcheck.engine.buckets``), then Hypothesis under ``settings``.

    Every example goes through ``laws.check``; an exception of any kind is a failure of the law
    (the implementation raising on valid input arrives as a ``LawViolation`` with its traceback).
    The run ends at ``deadlines.search`` while nothing failed, at ``deadlines.shrink`` while
    shrinking (keeping the smallest failure so far). With ``settings.report_multiple_bugs`` a boundary
    example's failure leaves the search on to look for distinct failures; without, it ends the search,
    and Hypothesis shrinks its first failure only. ``on_run(result)`` is called after every run."""
    from hypothesis import given
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.errors import UnsatisfiedAssumption
    from hypothesis.reporting import with_reporter

    from ..engine import laws
    from ..engine.buckets import triton_cache_entries
    from ..engine.examples import examples

    result = LawResult(law)
    failures: list[Failure] = []
    drawn = examples(law, impl, limits, mode, buckets)
    started = time.monotonic()
    fixed: Failure | None = None    # a boundary example's failure: already minimal; the search looks for others
    for example in () if buckets else laws.boundary_examples(law, impl, mode):   # boundaries first, as ci
        result.examples += 1
        try:
            outcome = laws.check(law, impl, example, device=device, strict=strict)
        except UnsatisfiedAssumption:    # a vacuous boundary example (``Trial.vacuous``): no verdict there
            continue
        except Exception as err:
            fixed = Failure.of(example, err)
            result.search_seconds = time.monotonic() - started
            break
        result.count_notes(outcome)

    if fixed is not None and not settings.report_multiple_bugs:
        result.failure, result.seconds = fixed, time.monotonic() - started
        return result

    def attempt(data):
        example = data.draw(drawn)     # before stopping: Hypothesis checks that every run draws alike
        if time.monotonic() > (deadlines.shrink if failures else deadlines.search):
            raise _OutOfTime
        if failures:
            result.shrink_runs += 1
        else:
            result.examples += 1
        entries, began = triton_cache_entries(), time.monotonic()
        try:
            outcome = laws.check(law, impl, example, device=device, strict=strict)
        except UnsatisfiedAssumption:    # a vacuous example (``Trial.vacuous``): Hypothesis draws another
            raise
        except Exception as err:
            if not failures:
                result.search_seconds = time.monotonic() - started
            failures.append(Failure.of(example, err))
            result.failure = failures[-1]      # each failure the shrinker keeps is smaller than the last
            raise
        finally:
            if triton_cache_entries() > entries:
                result.compiling_seconds += time.monotonic() - began
            if on_run:
                on_run(result)
        result.count_notes(outcome)

    # one database entry per law and implementation (the source of ``attempt`` is the same for all)
    # Hypothesis reads this private attribute off the test function: mypy knows no such attribute on a function
    attempt._hypothesis_internal_add_digest = f"refcheck-fuzz/{law.name}/{impl.op}/{impl.target}".encode()  # type: ignore[attr-defined]
    test = settings(given(st.data())(attempt))
    if seed is not None:
        test = hseed(seed)(test)
    try:
        with with_reporter(_without_seed_hint):
            test()
    except _OutOfTime:
        result.out_of_time = True
    except Exception as err:
        if not failures:
            raise
        # the final replay of each distinct failure's minimal example raised ``err`` (an exception group of
        # them where there are several: ``laws.violation``); Flaky wraps one that did not fail again
        replayed = [f for e in laws.distinct_failures(err) for f in failures if f.error is e]
        result.failure, result.others = (replayed[0], replayed[1:]) if replayed else (result.failure, [])
        result.flaky = not replayed
    if fixed is not None:   # the boundary's failure first; the search's of another signature after it
        found = [f for f in (result.failure, *result.others) if f is not None and _signature(f) != _signature(fixed)]
        result.failure, result.others = fixed, found
    result.seconds = time.monotonic() - started
    if not failures:
        result.search_seconds = result.seconds
    return result


def _signature(failure: Failure) -> str:
    """Which failure it is (``laws.violation``): the violation's signature, else the exception's type."""
    return getattr(failure.error, "signature", "") or type(failure.error).__name__


# --- the reproducer --------------------------------------------------------------------------------

def reproducer_name(op: str, law_name: str, index: int = 0) -> str:
    """The reproducer's file name; the second and later distinct failures of a law get ``-2``, ``-3``, ..."""
    return f"refcheck-repro-{op}-{law_name}{'' if index == 0 else f'-{index + 1}'}.py"


def reproducer(result: LawResult, impl, *, device: str, strict: bool, command: str,
               failure: Failure | None = None) -> str:
    """The text of a standalone script that reruns the minimal failing example of ``result``
    (``failure``: one of its distinct failures, default the first; ``refcheck.engine.reproduce.law``, with
    the user's import root and budget files): it raises (exit status 1) while the law is still broken and
    prints that it holds once fixed."""
    from ..engine.oneliner import impl_arguments, import_root
    from ..model import budgets as budgets_mod

    failure = failure or result.failure
    assert failure is not None   # a reproducer is written for a falsified law only
    example, law = failure.example, result.law
    header = [f"refcheck fuzz reproducer: law {law.name} ({law.number}) falsified for {impl.op} by {impl.target}",
              f"found by: {command}", "", "run it alone:  python <this file>  (raises while the bug is there)", "",
              *failure.text.splitlines()]
    root = import_root(impl)
    paths = budgets_mod.user_paths()
    spec, keywords = impl_arguments(impl)
    return "\n".join([
        "#!/usr/bin/env python",
        *(f"# {line}".rstrip() for line in header),
        "import sys",
        "",
        *([f"sys.path.insert(0, {root!r})  # where {impl.target.partition(':')[0]} was imported from", ""] if root else []),
        "from refcheck.model.case import Case",
        "from refcheck.engine.reproduce import law",
        "",
        f"law({law.name!r}, {spec},",
        f"    {example.case.to_python()},",
        f"    mode={example.mode!r}, knobs={dict(example.knobs)!r}, params={dict(example.params)!r},",
        f"    device={device!r}, strict={strict!r}" + "".join(f", {k}" for k in keywords)
        + (f", budgets={list(paths)!r}" if paths else "") + ")  # raises LawViolation",
        ""])


# --- command line ----------------------------------------------------------------------------------

def add_parser(subparsers) -> None:
    from .selection import add_options

    p = subparsers.add_parser("fuzz", help="search for a counterexample to every law of an op, for one implementation",
                              description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("op", help="the op (refcheck.model.ops; a user's with --op-card)")
    add_options(p, op=False)
    p.add_argument("--law", action="append", default=[], metavar="NAME",
                   help="only this law (repeatable, or comma-separated); default: every applicable one")
    p.add_argument("--max-examples", type=int, default=None, metavar="N",
                   help="examples per law, divided by the law's cost (default: the fuzz profile's, 500)")
    p.add_argument("--seconds", type=float, default=None, metavar="S",
                   help="search for S seconds of wall time, shared out among the laws, as many examples as fit unless "
                        f"--max-examples caps them (shrinking a counterexample a law found takes up to max(its share, "
                        f"{MIN_SHRINK_SECONDS:g} s) more)")
    p.add_argument("--precision", default=None, choices=("ieee", "tf32", "tf32x3"), help="only this precision mode")
    p.add_argument("-x", "--exitfirst", action="store_true",
                   help="stop at the first failure, as pytest -x: its law's search ends there with that failure "
                        "shrunk (no search for distinct failures), and the laws after it are not searched")
    p.add_argument("--strict-bitwise", action="store_true",
                   help="laws exact in real arithmetic fail when they hold within budget but not bit for bit")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the search (default: random); a seeded search, as Hypothesis' @seed, neither replays "
                        "nor saves examples in the database")
    p.add_argument("--out-dir", type=Path, default=Path("."), help="where reproducers are written (default: .)")
    p.add_argument("--gpus", default="1", metavar="N|all",
                   help="on a GPU: search the laws in N worker processes at once (all: one per GPU of the host), "
                        "worker i on GPU i mod GPUs; a kernel that crashes one ends only its law's search")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch threads of the search (default 1: on a loaded machine threads fighting over cores "
                        "cost more than they give)")
    p.add_argument("--database", type=Path, default=None, metavar="DIR",
                   help=f"Hypothesis example database (default: $REFCHECK_EXAMPLE_DB, else {DATABASE} in the "
                        "working directory)")
    p.set_defaults(run=run)


def gpu_workers(gpus: str) -> int:
    """The worker processes of ``--gpus``: N, or with ``all`` one per GPU of the host."""
    from ..runtime.workers import gpu_count
    return gpu_count() if gpus == "all" else int(gpus)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def command_line(args) -> str:
    """The ``refcheck fuzz`` command line of ``args`` (for the reproducer's header)."""
    words = ["refcheck", "fuzz", args.op]
    for name in ("impl", "dtype", "law", "budgets"):
        for value in getattr(args, name):
            words += [f"--{name}", value]
    for name in ("max_examples", "seconds", "precision", "device", "seed"):
        if getattr(args, name) is not None:
            words += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    words += [f"--{name.replace('_', '-')}" for name in ("forward_only", "strict_bitwise", "exitfirst") if getattr(args, name)]
    return " ".join(shlex.quote(w) for w in words)


def laws_to_search(impl, names: list[str]):
    """The laws to search, and the skipped ones with the reason."""
    from ..engine.laws import LAWS
    from ..engine.laws import law as get_law

    chosen = list(LAWS.values())
    if names:
        try:
            chosen = [get_law(n) for n in names]
        except ValueError as err:
            raise UsageError(f"--law: {err}") from None
    searched = sorted((law for law in chosen if law.why_not(impl) is None), key=lambda law: law.cost)   # cheap first
    skipped = [(law, law.why_not(impl)) for law in chosen if law.why_not(impl) is not None]
    if not searched:
        raise UsageError(f"no law to search for {impl.op}/{impl.name}: "
                         + "; ".join(f"{law.name}: {why}" for law, why in skipped))
    return searched, skipped


def checked_selection(args):
    """The device and implementation of a ``fuzz`` command line; ``UsageError`` for anything off
    (checked before any kernel runs: budgets, device, op, dtypes, the implementation)."""
    from ..model.ops import OPS
    from .selection import SelectionError, items, load_op_cards, select

    if args.max_examples is not None and args.max_examples < 1:
        raise UsageError(f"--max-examples: expected a positive count, got {args.max_examples}")
    if args.threads < 1:
        raise UsageError(f"--threads: expected a positive count, got {args.threads}")
    if args.seconds is not None and not args.seconds > 0:
        raise UsageError(f"--seconds: expected a positive number, got {args.seconds}")
    if args.gpus != "all" and not (args.gpus.isdigit() and int(args.gpus) >= 1):
        raise UsageError(f"--gpus: expected a positive count or 'all', got {args.gpus!r}")
    if not args.out_dir.is_dir():
        raise UsageError(f"--out-dir: folder {args.out_dir} does not exist")
    try:
        load_op_cards(args.op_card)
    except SelectionError as err:
        raise UsageError(str(err)) from None
    if args.op not in OPS:
        raise UsageError(f"unknown op {args.op!r}; known ops: {', '.join(OPS)}")
    specs = items(args.impl)
    if len(specs) != 1:
        raise UsageError(f"--impl: fuzz searches one implementation at a time, got {len(specs)}")
    try:
        selection = select(impls=specs, ops=[args.op], dtypes=args.dtype, budgets=args.budgets, device=args.device,
                           forward_only=args.forward_only, op_cards=args.op_card,
                           isolated=getattr(args, "isolated", False))
    except SelectionError as err:
        raise UsageError(str(err)) from None
    if len(selection.named) != 1:
        raise UsageError(f"--impl {specs[0]}: names {len(selection.named)} implementations of {args.op}")
    impl = selection.narrowed(selection.named[0])
    if args.precision is not None and args.precision not in impl.modes:
        raise UsageError(f"--precision {args.precision}: {impl.target} offers {', '.join(impl.modes)} "
                         "(a callable gets the mode as a `precision` keyword argument)")
    if ":" in impl.target and impl.name == impl.target and not impl.triton:
        # a Triton package with autotuned kernels gets its configs pinned by path_agreement
        from ..engine import laws
        if laws.autotuned_kernels(dataclasses.replace(impl, triton=True)):
            impl = dataclasses.replace(impl, triton=True)
    return selection.device, impl


UNCAPPED = 10 ** 7
"""The example count of a law searched for a time (``--seconds`` without ``--max-examples``): the deadline ends it."""


def search_all(impl, laws: list, settings, *, device: str, mode: str | None, seconds: float | None,
               strict: bool, seed: int | None, console, buckets: tuple = (), uncapped: bool = False,
               on_found=None) -> list[LawResult]:
    """``search`` every law in turn, with a progress bar per law on ``console``. With ``seconds``,
    each law searches for the search time left divided by the laws left; shrinking comes on top;
    ``uncapped``, the example count is no limit then (the time is). With ``buckets`` (a GPU run), each
    law gets the full example count. ``on_found(result)`` is called as soon as a law is falsified."""
    from hypothesis import settings as hsettings
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..engine import laws as laws_mod

    slow = laws_mod.interpreted(impl, device)
    limits = case_limits(impl, device)
    results: list[LawResult] = []
    progress = Progress(TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console)
    with progress:
        for i, law in enumerate(laws):
            count = settings.max_examples if buckets else laws_mod.examples_for(law, settings, interpreted=slow)
            count = UNCAPPED if uncapped and seconds else count
            share = (seconds - sum(r.search_seconds for r in results)) / (len(laws) - i) if seconds else None
            deadlines = Deadlines.after(share)
            task = progress.add_task(f"{law.name} ({law.number})", total=None if count == UNCAPPED else count,
                                     status="")

            def on_run(result, task=task):
                status = f"shrinking: {result.shrink_runs} runs" if result.failure else ""
                progress.update(task, completed=result.examples, status=status)

            result = search(law, impl, hsettings(settings, max_examples=count), limits=limits, mode=mode,
                            device=device, strict=strict, deadlines=deadlines, seed=seed, on_run=on_run,
                            buckets=buckets)
            progress.update(task, completed=result.examples, status=result.status)
            results.append(result)
            if result.found and on_found is not None:
                on_found(result, time.monotonic())
            if result.found and not settings.report_multiple_bugs:    # --exitfirst
                break
    return results


def search_in_workers(impl, laws: list, *, max_examples: int, database: str, device: str, mode: str | None,
                      seconds: float | None, strict: bool, seed: int | None, buckets: tuple, jobs: int,
                      console, multiple: bool = True) -> list[LawResult]:
    """On a GPU: each law's ``search`` in a worker process of its own (``refcheck.runtime.workers``),
    ``jobs`` at a time, worker i on GPU i mod GPUs (``--gpus``). A kernel that loses the CUDA context
    ends one worker: that law's result is the crash (``LawResult.crash``), its example and reproducer
    written to ``REFCHECK_FAILURE_DIR``, and the other laws go on. With ``seconds``, each law searches
    ``seconds * jobs / laws`` (shrinking on top), the laws running ``jobs`` at a time. Without ``multiple``
    (``--exitfirst``) each law stops at its first failure (the laws already running finish)."""
    from ..runtime.workers import Unit, execute
    share = seconds * min(jobs, len(laws)) / len(laws) if seconds else None

    def crashed(law):
        return lambda message: LawResult(law, crash=message)

    units = [Unit(f"{law.name} ({law.number})", _search_unit,
                  (law.name, impl, max_examples, database, mode, strict, share, seed, buckets, multiple), 1.0,
                  _one, crashed=crashed(law))
             for law in laws]
    return execute(units, device, min(jobs, len(units)), console, "searching")


def _one(result: LawResult) -> list[LawResult]:
    return [result]


def _search_unit(law_name: str, impl, max_examples: int, database: str, mode: str | None, strict: bool,
                 seconds: float | None, seed: int | None, buckets: tuple, multiple: bool, device: str) -> LawResult:
    """One law's ``search`` in a worker process: the ``fuzz`` profile at ``max_examples`` over the example
    database ``database``; its result with the failure's exception reduced to its text (to travel back)."""
    from hypothesis import settings as hsettings
    from hypothesis.database import DirectoryBasedExampleDatabase

    from ..engine import laws as laws_mod
    from ..strategies import profiles
    profiles.register()
    settings = hsettings(hsettings.get_profile("fuzz"), max_examples=max_examples, report_multiple_bugs=multiple,
                         database=DirectoryBasedExampleDatabase(database))
    result = search(laws_mod.law(law_name), impl, settings, limits=case_limits(impl, device), mode=mode,
                    device=device, strict=strict, deadlines=Deadlines.after(seconds), seed=seed, buckets=buckets)
    if result.failure is not None:
        result.failure, *result.others = [Failure(f.example, RuntimeError(f.text), f.text)
                                          for f in (result.failure, *result.others)]
    return result


def case_limits(impl, device: str):
    """Case sizes: ``LARGE`` on a GPU, else the ``fuzz`` profile's (``INTERPRETED`` for a Triton kernel)."""
    from ..engine import laws
    from ..strategies import LARGE, profiles
    return LARGE if device != "cpu" else profiles.limits("fuzz", laws.interpreted(impl, device))


def compile_buckets(impl, device: str, *, seed: int | None, mode: str | None, out) -> tuple[tuple, dict]:
    """On a GPU: the implementation's compile buckets (``refcheck.engine.buckets``, from ``seed`` or a
    fresh one) compiled in parallel processes; their ``warm_up`` figures. On the CPU: none."""
    from rich.console import Console

    from ..engine.buckets import plan, run_seed, warm_up, warm_ups
    from ..runtime.workers import default_jobs
    if device == "cpu":
        return (), {}
    seed = run_seed(seed)
    buckets = plan(impl, case_limits(impl, device), seed=seed, mode=mode)
    jobs = warm_ups(impl, buckets, seed=seed)
    out.print(f"compile buckets of seed {seed} (--seed {seed} repeats them): {len(buckets)}; "
              f"compiling them by {_count(len(jobs), 'law run')} in parallel")
    took = warm_up(jobs, device, min(len(jobs), default_jobs(device)), Console(stderr=True))
    return buckets, took


def print_finding(out, r: LawResult, impl, args, device: str, strict: bool) -> None:
    """A falsified law's distinct failures, each with its minimal example and the reproducer written for it."""
    from rich.markup import escape
    if r.failure is None:           # a crash or a warm-up's failure, printed with the summary
        return
    distinct = [r.failure, *r.others]
    for i, failure in enumerate(distinct):
        path = args.out_dir / reproducer_name(impl.op, r.law.name, i)
        path.write_text(reproducer(r, impl, device=device, strict=strict, command=command_line(args), failure=failure))
        found = "smallest example when time ran out" if r.out_of_time else "minimal example"
        which = f", distinct failure {i + 1} of {len(distinct)}" if len(distinct) > 1 else ""
        out.print(f"\n[bold red]law {r.law.name} ({r.law.number}) falsified[/] after {_count(r.examples, 'example')} "
                  f"({found} after {_count(r.shrink_runs, 'shrink run')}{which})"
                  + (" - flaky: it passed when replayed" if r.flaky else "") + ":")
        out.print(failure.text, markup=False)
        out.print(f"reproducer: {escape(str(path))}  (python {escape(str(path))})")


def print_summary(out, impl, results: list[LawResult]) -> None:
    """The table of laws searched (examples, result, seconds) and the bitwise notes."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"refcheck fuzz {impl.op} {escape(f'[{impl.name}]')}")
    for col in ("law", "examples", "result", "seconds"):
        table.add_column(col, justify="right" if col in ("examples", "seconds") else "left")
    for r in results:
        status = f"[bold red]{r.status}[/]" if r.found else r.status
        table.add_row(f"{r.law.name} ({r.law.number})", str(r.examples), status, f"{r.seconds:.1f}")
    out.print(table)
    for r in results:
        for line, n in r.notes.items():
            out.print(f"  note: {escape(line)} in {_count(n, 'example')}")


def run(args) -> int:
    from hypothesis import settings as hsettings
    from hypothesis.database import DirectoryBasedExampleDatabase
    from rich.console import Console
    from rich.markup import escape

    from ..engine import laws as laws_mod
    from ..runtime.workers import FAILURE_DIR_ENV
    from ..strategies import profiles
    from .selection import items

    device, impl = checked_selection(args)
    to_search, skipped = laws_to_search(impl, items(args.law))
    import torch
    torch.set_num_threads(args.threads)
    profiles.register()
    base = hsettings.get_profile("fuzz")
    database = str(args.database or os.environ.get(profiles.EXAMPLE_DB_ENV) or DATABASE)
    settings = hsettings(base, max_examples=args.max_examples or base.max_examples,
                         report_multiple_bugs=not args.exitfirst, database=DirectoryBasedExampleDatabase(database))
    strict = args.strict_bitwise or laws_mod.strict_default()
    out = Console(highlight=False, soft_wrap=True)
    who = impl.name if impl.name == impl.target else f"{impl.name} = {impl.target}"
    scaled = f", x{laws_mod.INTERPRETED_SHARE:g} interpreted" if laws_mod.interpreted(impl, device) else ""
    caps = (f"as many examples as {args.seconds:g} s allow, cheap laws first" if args.seconds and args.max_examples is None
            else f"up to {settings.max_examples} examples each (divided by the law's cost{scaled})"
            + (f", {args.seconds:g} s" if args.seconds else ""))
    out.print(f"fuzzing {impl.op} {escape(f'[{who}]')} on {device}: {_count(len(to_search), 'law')}, {caps}"
              + (f", seed {args.seed}" if args.seed is not None else "") + f", {_count(args.threads, 'torch thread')}")
    for law, why in skipped:
        out.print(f"  not searched: {law.name}: {escape(why)}")

    started = time.monotonic()
    if device != "cpu":
        os.environ.setdefault(FAILURE_DIR_ENV, str(args.out_dir))     # where a crash's example goes
    buckets, took = compile_buckets(impl, device, seed=args.seed, mode=args.precision, out=out)
    if device != "cpu":
        from ..runtime import autotune
        out.print(escape(autotune.describe()))
    seconds = args.seconds - took["seconds"] if args.seconds and took else args.seconds
    if device == "cpu":
        def found(r, now):
            out.print(f"\n[bold red]found after {now - started:.0f} s[/]:")
            print_finding(out, r, impl, args, device, strict)
        results = search_all(impl, to_search, settings, device=device, mode=args.precision, seconds=seconds,
                             strict=strict, seed=args.seed, console=Console(stderr=True), buckets=buckets,
                             uncapped=args.max_examples is None, on_found=found)
    else:
        results = search_in_workers(impl, to_search, max_examples=settings.max_examples, database=database,
                                    device=device, mode=args.precision, seconds=seconds, strict=strict,
                                    seed=args.seed, buckets=buckets, jobs=gpu_workers(args.gpus),
                                    console=Console(stderr=True), multiple=not args.exitfirst)
    for r in results:       # a warm-up is a drawn example too: what it found stands if the search missed it
        r.warm_up = took.get("failed", {}).get((r.law.name, impl.op, impl.name)) if not r.found else None
    print_summary(out, impl, results)
    if took:
        examples_s = sum(r.seconds for r in results)
        compiling = took["seconds"] + sum(r.compiling_seconds for r in results)
        out.print(f"time: {took['seconds']:.0f} s compiling {len(buckets)} buckets ({took['processes']} processes, "
                  f"{took['compiled']} new Triton cache entries), {examples_s:.0f} s running "
                  f"{_count(sum(r.examples + r.shrink_runs for r in results), 'example')}, of which "
                  f"{sum(r.compiling_seconds for r in results):.0f} s in examples that compiled: "
                  f"{100 * compiling / max(took['seconds'] + examples_s, 1e-9):.0f}% of the time compiling")
    for r in results:
        if r.crash is not None:
            out.print(f"\n[bold red]law {r.law.name} ({r.law.number}) crashed its worker:[/] {escape(r.crash)}; the "
                      f"example and its reproducer: {escape(os.environ.get(FAILURE_DIR_ENV, '.'))}/cuda-context-lost-*.txt")
        elif r.warm_up is not None:
            out.print(f"\n[bold red]law {r.law.name} ({r.law.number}) failed on a compile warm-up's example[/] "
                      "(its search met no failure again, or had no time left):")
            out.print(r.warm_up.removeprefix("crashed: ") + ("" if not r.warm_up.startswith("crashed:") else
                      f"; the example and its reproducer: {os.environ.get(FAILURE_DIR_ENV, '.')}/cuda-context-lost-*.txt"),
                      markup=False)
    falsified = [r for r in results if r.found]
    for r in falsified if device != "cpu" else ():    # on the CPU each was printed when found
        print_finding(out, r, impl, args, device, strict)
    elapsed, total = time.monotonic() - started, _count(sum(r.examples for r in results), "example")
    if falsified:
        unsearched = [law.name for law in to_search[len(results):]]
        out.print(f"\n{len(falsified)} of {_count(len(results), 'law')} falsified ({total}, {elapsed:.0f} s): "
                  + ", ".join(r.law.name for r in falsified)
                  + (f"; stopped at the first failure (--exitfirst), not searched: {', '.join(unsearched)}"
                     if unsearched else ""))
        return 1
    not_run = [r.law.name for r in results if not r.examples]
    out.print(f"\nno counterexample in {total} ({_count(len(results), 'law')}, {elapsed:.0f} s)"
              + (f"; not run for lack of time: {', '.join(not_run)}" if not_run else ""))
    if not_run:
        spent = f" (compiling took {took['seconds']:.0f} s of them)" if took else ""
        out.print(f"[bold red]incomplete:[/] {_count(len(not_run), 'law')} tested nothing"
                  + (f" in {args.seconds:g} s{spent}; give --seconds more time" if args.seconds else ""))
        return NOTHING_TESTED
    return 0
