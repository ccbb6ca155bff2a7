"""refcheck's pytest plugin: the laws of ``refcheck.properties`` over any implementation, from any folder.

Installed with refcheck (entry point ``pytest11``: ``refcheck``), it adds the options and runs the
law tests; in a project of your own::

    pytest --pyargs refcheck.properties --impl simple_gla=mykernels:chunk_simple_gla -n auto

Options (the same words as the ``refcheck`` commands, ``refcheck.commands.selection``): ``--impl SPEC``,
``--op OP``, ``--dtype DT``, ``--budgets FILE``, ``--device cpu|cuda``, ``--forward-only``, plus
``--precision MODE`` (the mode of implementations that have a precision knob), ``--strict-bitwise``
(a law exact in real arithmetic that holds within budget but not bit for bit fails), and
Hypothesis' ``--hypothesis-profile`` (``ci`` by default; ``dev``, ``fuzz``, ``gpu``: see
``refcheck.strategies.profiles``). A ``gpu`` run draws compile buckets (``refcheck.engine.buckets``) from a seed it
prints (``--bucket-seed N`` repeats it) and, on a GPU, compiles them in parallel processes before the
first test (``--no-warm-up`` skips that, ``--warm-up`` does it on the CPU too). Every option is checked before any
kernel runs: a budgets file that does not
validate, an implementation that does not import, does not fit the op's contract or cannot run
here, or a dtype the op does not have, is a usage error (exit status 4), never a skip.

A test in ``refcheck/properties`` is marked ``@pytest.mark.law(NAME)`` and takes the fixtures
``impl`` and ``check_law``: it runs once per selected implementation of every op the law concerns.
A registered peer that is not installed here is skipped with its reason (the one legitimate skip);
a law that concerns none of the selected implementations is deselected, not skipped.

The plugin stays out of test sessions that are not about refcheck: it configures the backend (the
Triton interpreter on a machine without a GPU) when an option of its own is given, or when the
first law test is collected.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings
from dataclasses import dataclass

import hypothesis
import pytest

from ..model.case import PRECISION_MODES
from ..runtime import compile_clock
from ..runtime.workers import FAILURE_DIR_ENV
from ..strategies import profiles
from .selection import HELP, Selection

profiles.register()   # before Hypothesis' plugin loads --hypothesis-profile

OPTIONS = ("impl", "op", "dtype", "budgets", "device", "precision", "forward_only", "strict_bitwise", "bucket_seed")


def pytest_addoption(parser):
    group = parser.getgroup("refcheck")
    group.addoption("--impl", action="append", default=[], metavar="SPEC", help=HELP["impl"])
    group.addoption("--op", action="append", default=[], metavar="OP", help=HELP["op"])
    group.addoption("--op-card", action="append", default=[], metavar="MODULE:ATTR", help=HELP["op_card"])
    group.addoption("--dtype", action="append", default=[], metavar="DT", help=HELP["dtype"])
    group.addoption("--budgets", action="append", default=[], metavar="FILE", help=HELP["budgets"])
    group.addoption("--device", choices=("cpu", "cuda"), default=None, help=HELP["device"])
    group.addoption("--forward-only", action="store_true", default=False, help=HELP["forward_only"])
    group.addoption("--precision", choices=PRECISION_MODES, default=None,
                    help="precision mode of implementations with a precision knob (default: drawn)")
    group.addoption("--strict-bitwise", action="store_true", default=False,
                    help="fail laws exact in real arithmetic (batch invariance, varlen, state chaining, ...) "
                         "that hold within budget but not bit for bit")
    group.addoption("--bucket-seed", type=int, default=None, metavar="N",
                    help="the seed of a gpu-profile run's compile buckets (default: a fresh one, printed)")
    group.addoption("--warm-up", action=argparse.BooleanOptionalAction, default=None,
                    help="compile a gpu-profile run's buckets in parallel processes before the first test "
                         "(default: on a GPU)")


@dataclass(frozen=True)
class RefcheckConfig:
    selection: Selection
    precision: str | None
    strict: bool
    profile: str
    bucket_seed: int | None     # compile buckets drawn from this seed (a BUCKETED profile), else None

    @property
    def device(self) -> str:
        return self.selection.device


CONFIG = pytest.StashKey[RefcheckConfig]()
WARM_UP_FAILED = pytest.StashKey[dict]()
"""What the compile warm-up's examples found (``refcheck.engine.buckets.warm_up``'s ``failed``)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "law(name): a property test of the law refcheck.engine.laws.LAWS[name]")
    config.addinivalue_line("markers", "refcheck_nothing: a law test no selected implementation meets (deselected)")
    if any(config.getoption(name, None) not in (None, False, []) for name in OPTIONS):
        activate(config)


def activate(config) -> RefcheckConfig:
    """Validate the options, configure the backend and the Hypothesis profile (once per session)."""
    if CONFIG in config.stash:
        return config.stash[CONFIG]
    from .selection import SelectionError, select

    try:
        selection = select(impls=config.getoption("--impl"), ops=config.getoption("--op"),
                           dtypes=config.getoption("--dtype"), budgets=config.getoption("--budgets"),
                           device=config.getoption("--device"), forward_only=config.getoption("--forward-only"),
                           op_cards=config.getoption("--op-card"))
    except SelectionError as err:
        raise pytest.UsageError(f"refcheck: {err}") from None
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # CPU: tiny tensors: with one OpenMP thread per xdist worker, a [2,200,116] einsum takes
        # 50 us; with 2 threads per worker on 2 busy cores it took 16 ms (measured here). GPU: the
        # workers share the cores for the float64 references, and go round the host's GPUs.
        import torch

        from ..runtime.workers import share_gpu, threads_per_process
        jobs = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
        torch.set_num_threads(threads_per_process(selection.device, jobs))
        if selection.device != "cpu":
            share_gpu(xdist_worker_index(os.environ["PYTEST_XDIST_WORKER"]), jobs)
    elif selection.device == "cpu":
        import torch
        torch.set_num_threads(1)
    profile = config.getoption("hypothesis_profile", None) or profiles.DEFAULT
    profiles.load(profile)
    from ..engine.laws import strict_default  # after the backend is configured: laws import kernels
    strict = config.getoption("--strict-bitwise") or strict_default()
    seed = None
    if profile in profiles.BUCKETED:
        from ..engine.buckets import run_seed
        seed = run_seed(config.getoption("--bucket-seed"))   # inherited by xdist workers through the environment
    config.stash[CONFIG] = cfg = RefcheckConfig(selection, config.getoption("--precision"), strict, profile, seed)
    return cfg


def xdist_worker_index(worker_id: str) -> int:
    """The number of an xdist worker from its id (``gw3`` -> 3; a replaced worker gets a new number)."""
    digits = worker_id.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` on a GPU: as many workers as ``refcheck.runtime.workers.default_jobs`` gives (at most 8
    a GPU: they share its memory and time-slice its engine; each worker on one GPU with its share of the
    memory, ``share_gpu``); None elsewhere (xdist's own count). ``tryfirst``: xdist's own implementation,
    registered after a plugin given with ``-p``, answered first before (the core count: 16 workers on an
    H100, whose 80 GB they exhausted, FLA's laws failing with out of memory)."""
    device = config.getoption("--device", None)
    if device == "cpu":
        return None
    import torch
    if device is None and not torch.cuda.is_available():
        return None
    from ..runtime.workers import default_jobs
    return default_jobs("cuda")


def pytest_report_header(config):
    cfg = config.stash.get(CONFIG, None)
    lines = []
    if cfg is not None and cfg.bucket_seed is not None:
        lines.append(f"refcheck: compile buckets of seed {cfg.bucket_seed} (repeat with --bucket-seed {cfg.bucket_seed})")
    if cfg is not None and cfg.device != "cpu":
        from ..runtime import autotune
        lines.append(f"refcheck: {autotune.describe()}")
    if cfg is not None:
        from ..engine.laws import LAWS
        for op in dict.fromkeys(op for law in LAWS.values() for op in law.ops):
            for impl in cfg.selection.implementations(op):
                why = impl.refused_backward(cfg.device)
                if why:
                    lines.append(f"refcheck: {op}/{impl.name} checked forward only: {why}")
    return lines


def _selected(cfg) -> list:
    """The selected implementations that can run here (narrowed to the selected dtypes)."""
    from ..engine.laws import LAWS
    found = {}
    for op in dict.fromkeys(op for law in LAWS.values() for op in law.ops):
        for impl in cfg.selection.implementations(op):
            narrowed = cfg.selection.narrowed(impl)
            if narrowed is not None and narrowed.unavailable(cfg.device) is None:
                found[(op, impl.name)] = narrowed
    return list(found.values())


def _mode(cfg, impl) -> str | None:
    return cfg.precision if cfg.precision in impl.modes else None


def _buckets(cfg, impl) -> tuple:
    """The compile buckets of ``impl`` in this run (the same in every process: drawn from the seed)."""
    from ..engine.buckets import plan
    from ..engine.laws import interpreted
    key = (impl.op, impl.name)
    if key not in _PLANS:
        _PLANS[key] = plan(impl, profiles.limits(cfg.profile, interpreted(impl, cfg.device)),
                           seed=cfg.bucket_seed, mode=_mode(cfg, impl))
    return _PLANS[key]


_PLANS: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """A gpu-profile run on a GPU: compile every selected implementation's buckets in parallel
    processes before the first test (in the controller, before pytest-xdist starts its workers)."""
    config = session.config
    cfg = config.stash.get(CONFIG, None)
    wanted = config.getoption("--warm-up")
    if (cfg is None or cfg.bucket_seed is None or hasattr(config, "workerinput")
            or not (wanted or (wanted is None and cfg.device != "cpu"))):
        return
    from rich.console import Console

    from ..engine.buckets import warm_up, warm_ups
    jobs, counts = [], []
    for impl in _selected(cfg):
        planned = _buckets(cfg, impl)
        counts.append(f"{impl.op}/{impl.name} {len(planned)}")
        jobs += warm_ups(impl, planned, seed=cfg.bucket_seed)
    if not jobs:
        return
    from ..runtime.workers import default_jobs
    processes = min(len(jobs), default_jobs(cfg.device))
    console = Console(stderr=True)
    # before compiling: a warm-up that crashes the run still leaves the seed that repeats it
    console.print(f"refcheck: compile buckets of seed {cfg.bucket_seed} (repeat with --bucket-seed {cfg.bucket_seed})")
    took = warm_up(jobs, cfg.device, processes, console)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    line = (f"refcheck: compile buckets ({', '.join(counts)}) warmed up by {took['runs']} law runs in "
            f"{took['seconds']:.0f} s ({processes} processes, {took['compiled']} new Triton cache entries)")
    if reporter is not None:
        reporter.write_line(line)
    config.stash[WARM_UP_FAILED] = failed = took["failed"]
    if failed and reporter is not None:
        reporter.write_line(f"refcheck: {len(failed)} warm-up example(s) broke their law: listed at the end; the run fails "
                            "even where the law's own test does not meet the example again", red=True)
    folder = os.environ.get(FAILURE_DIR_ENV)
    for (law, op, name), what in failed.items() if folder else ():
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{file_name(f'warm-up-{law}-{op}-{name}')}.txt"), "w") as fh:
            fh.write(f"the compile warm-up's example of law {law} on {op}/{name}\n\n{what}\n")


def pytest_sessionfinish(session, exitstatus):
    """A warm-up example that broke its law fails the run (a drawn example like any other)."""
    if session.config.stash.get(WARM_UP_FAILED, None) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_generate_tests(metafunc):
    """Parametrize a law test over the selected, applicable implementations of the law's ops."""
    if "impl" not in metafunc.fixturenames:
        return
    from ..engine.laws import law as get_law

    marker = metafunc.definition.get_closest_marker("law")
    if marker is None:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: a test taking `impl` needs @pytest.mark.law(NAME)")
    cfg = activate(metafunc.config)
    law = get_law(marker.args[0])
    params = []
    for op in law.ops:
        for impl in cfg.selection.implementations(op):
            narrowed = cfg.selection.narrowed(impl)
            if narrowed is None or law.why_not(narrowed):
                continue
            why = impl.unavailable(cfg.device)
            marks = [pytest.mark.skip(reason=f"{op}/{impl.name} unavailable on {cfg.device}: {why}")] if why else []
            params.append(pytest.param(narrowed, id=f"{op}-{impl.name}", marks=marks))
    if not params:
        params = [pytest.param(None, id="none", marks=pytest.mark.refcheck_nothing)]
    metafunc.parametrize("impl", params)


def pytest_collection_modifyitems(session, config, items):
    """Deselect law tests that concern none of the selected implementations; a selection that
    leaves no law test to run is a usage error, not a green run that tested nothing."""
    laws = [item for item in items if item.get_closest_marker("law") is not None]
    nothing = [item for item in laws if item.get_closest_marker("refcheck_nothing") is not None]
    if nothing:
        items[:] = [item for item in items if item not in nothing]
        config.hook.pytest_deselected(items=nothing)
    cfg = config.stash.get(CONFIG, None)
    if laws and cfg is not None and cfg.selection.named and len(nothing) == len(laws):
        names = ", ".join(f"{i.op}/{i.name}" for i in cfg.selection.named)
        raise pytest.UsageError(f"refcheck: no law test applies to {names} with the options given")


@pytest.fixture
def check_law(request):
    """``check_law(impl)``: search for a counterexample to the test's law with Hypothesis (the active
    profile); a falsified law fails with its message and reproducer (each distinct failure, shrunk; with
    ``-x`` the first only), bitwise differences of laws that held within budget become ``BitwiseDifference``
    warnings."""
    from ..engine.laws import BitwiseDifference, hypothesis_check, interpreted

    cfg = activate(request.config)
    name = request.node.get_closest_marker("law").args[0]

    def check(impl) -> None:
        mode = _mode(cfg, impl)
        limits = profiles.limits(cfg.profile, interpreted(impl, cfg.device))
        buckets = _buckets(cfg, impl) if cfg.bucket_seed is not None else ()
        count = hypothesis.settings().max_examples if buckets else None     # every law its full count
        first_only = request.config.getoption("maxfail") == 1     # -x: no search for distinct failures
        started, before = time.perf_counter(), compile_clock.reading()
        try:
            for note in hypothesis_check(name, impl, limits=limits, mode=mode, device=cfg.device, strict=cfg.strict,
                                         boundaries=cfg.profile == "ci", buckets=buckets, max_examples=count,
                                         multiple=not first_only):
                warnings.warn(BitwiseDifference(note), stacklevel=2)
        finally:
            compiled = compile_clock.reading() - before
            request.node.user_properties.append(
                (TIME_PROPERTY, (time.perf_counter() - started, compiled.seconds, compiled.compiles)))
    return check


TIME_PROPERTY = "refcheck_seconds"
"""A law test's user property: (wall seconds, seconds Triton compiled, compiles) in its worker."""
_TIMES: dict[str, tuple[float, float, int]] = {}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """What the warm-up's examples found; on a GPU, where the law tests' time went: compiling (what
    the warm-up did not cover) or the examples, the slowest tests first."""
    failed = config.stash.get(WARM_UP_FAILED, {})
    if failed:
        terminalreporter.section("refcheck: warm-up examples that broke their law", red=True)
        for (law, op, name), what in failed.items():
            terminalreporter.write_line(f"{law} on {op}/{name}:\n{what}\n")
    cfg = config.stash.get(CONFIG, None)
    if cfg is None or cfg.device == "cpu" or not _TIMES:
        return
    wall = sum(t[0] for t in _TIMES.values())
    compiling = sum(t[1] for t in _TIMES.values())
    terminalreporter.section("refcheck: where the law tests' time went")
    terminalreporter.write_line(f"{len(_TIMES)} law tests: {wall:.0f} s in their workers, of which {compiling:.0f} s "
                                f"compiling ({sum(t[2] for t in _TIMES.values())} compiles)")
    for nodeid, (seconds, compile_s, compiles) in sorted(_TIMES.items(), key=lambda kv: -kv[1][0])[:12]:
        terminalreporter.write_line(f"{seconds:7.1f} s  {compile_s:7.1f} s compiling ({compiles:3d})  {nodeid}")


def file_name(text: str) -> str:
    """``text`` (a test id, a law and implementation) as a file name: characters other than letters,
    digits and ``-_.[]`` become ``_``."""
    return "".join(c if c.isalnum() or c in "-_.[]" else "_" for c in text)


def pytest_runtest_logreport(report):
    """With ``REFCHECK_FAILURE_DIR`` set, write each failure's report to its own file there the moment
    the test fails: a run cut short by a time limit (a lent GPU) keeps what it found, which pytest's
    end-of-session summary would lose."""
    for key, value in report.user_properties:
        if key == TIME_PROPERTY and report.when == "call":
            _TIMES[report.nodeid] = tuple(value)
    folder = os.environ.get(FAILURE_DIR_ENV)
    if folder and report.failed:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{file_name(report.nodeid)}.{report.when}.txt"), "w") as fh:
            fh.write(f"{report.nodeid} ({report.when}, {report.duration:.1f} s)\n\n{report.longreprtext}\n")
