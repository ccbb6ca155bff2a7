"""refcheck's pytest plugin: the laws of ``refcheck.properties`` over any implementation, from any folder.

Installed with refcheck (entry point ``pytest11``: ``refcheck``), it adds the options and runs the
law tests; in a project of your own::

    pytest --pyargs refcheck.properties --impl simple_gla=mykernels:chunk_simple_gla -n auto

Options (the same words as the ``refcheck`` commands, ``refcheck.selection``): ``--impl SPEC``,
``--op OP``, ``--dtype DT``, ``--budgets FILE``, ``--device cpu|cuda``, ``--forward-only``, plus
``--precision MODE`` (the mode of implementations that have a precision knob), ``--strict-bitwise``
(a law exact in real arithmetic that holds within budget but not bit for bit fails), and
Hypothesis' ``--hypothesis-profile`` (``ci`` by default; ``dev``, ``fuzz``, ``gpu``: see
``refcheck.profiles``). Every option is checked before any kernel runs: a budgets file that does not
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

import os
import warnings
from dataclasses import dataclass

import pytest

from . import profiles
from .case import PRECISION_MODES
from .selection import HELP

profiles.register()   # before Hypothesis' plugin loads --hypothesis-profile

OPTIONS = ("impl", "op", "dtype", "budgets", "device", "precision", "forward_only", "strict_bitwise")


def pytest_addoption(parser):
    group = parser.getgroup("refcheck")
    group.addoption("--impl", action="append", default=[], metavar="SPEC", help=HELP["impl"])
    group.addoption("--op", action="append", default=[], metavar="OP", help=HELP["op"])
    group.addoption("--dtype", action="append", default=[], metavar="DT", help=HELP["dtype"])
    group.addoption("--budgets", action="append", default=[], metavar="FILE", help=HELP["budgets"])
    group.addoption("--device", choices=("cpu", "cuda"), default=None, help=HELP["device"])
    group.addoption("--forward-only", action="store_true", default=False, help=HELP["forward_only"])
    group.addoption("--precision", choices=PRECISION_MODES, default=None,
                    help="precision mode of implementations with a precision knob (default: drawn)")
    group.addoption("--strict-bitwise", action="store_true", default=False,
                    help="fail laws exact in real arithmetic (batch invariance, varlen, state chaining, ...) "
                         "that hold within budget but not bit for bit")


@dataclass(frozen=True)
class RefcheckConfig:
    selection: object      # refcheck.selection.Selection
    precision: str | None
    strict: bool
    profile: str

    @property
    def device(self) -> str:
        return self.selection.device


CONFIG = pytest.StashKey[RefcheckConfig]()


def pytest_configure(config):
    config.addinivalue_line("markers", "law(name): a property test of the law refcheck.laws.LAWS[name]")
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
                           device=config.getoption("--device"), forward_only=config.getoption("--forward-only"))
    except SelectionError as err:
        raise pytest.UsageError(f"refcheck: {err}") from None
    if selection.device == "cpu":
        # Tiny tensors: with one OpenMP thread per xdist worker, a [2,200,116] einsum takes 50 us;
        # with 2 threads per worker on 2 busy cores it took 16 ms (measured here).
        import torch
        torch.set_num_threads(1)
    profile = config.getoption("hypothesis_profile", None) or profiles.DEFAULT
    profiles.load(profile)
    strict = config.getoption("--strict-bitwise") or os.environ.get("REFCHECK_STRICT_BITWISE", "") not in ("", "0")
    config.stash[CONFIG] = cfg = RefcheckConfig(selection, config.getoption("--precision"), strict, profile)
    return cfg


def pytest_generate_tests(metafunc):
    """Parametrize a law test over the selected, applicable implementations of the law's ops."""
    if "impl" not in metafunc.fixturenames:
        return
    from .laws import law as get_law

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
    profile); a falsified law fails with its message and reproducer, bitwise differences of laws that
    held within budget become ``BitwiseDifference`` warnings."""
    from .laws import BitwiseDifference, hypothesis_check, interpreted

    cfg = activate(request.config)
    name = request.node.get_closest_marker("law").args[0]

    def check(impl) -> None:
        mode = cfg.precision if cfg.precision in impl.modes else None
        limits = profiles.limits(cfg.profile, interpreted(impl, cfg.device))
        for note in hypothesis_check(name, impl, limits=limits, mode=mode, device=cfg.device, strict=cfg.strict,
                                     boundaries=cfg.profile == "ci"):
            warnings.warn(BitwiseDifference(note))
    return check


def pytest_runtest_logreport(report):
    """With ``REFCHECK_FAILURE_DIR`` set, write each failure's report to its own file there the moment
    the test fails: a run cut short by a time limit (a lent GPU) keeps what it found, which pytest's
    end-of-session summary would lose."""
    folder = os.environ.get("REFCHECK_FAILURE_DIR")
    if folder and report.failed:
        os.makedirs(folder, exist_ok=True)
        name = "".join(c if c.isalnum() or c in "-_.[]" else "_" for c in report.nodeid)
        with open(os.path.join(folder, f"{name}.{report.when}.txt"), "w") as fh:
            fh.write(f"{report.nodeid} ({report.when}, {report.duration:.1f} s)\n\n{report.longreprtext}\n")
