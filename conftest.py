"""pytest configuration of refcheck: the backend first, then options, Hypothesis profiles and the
(op, implementation) matrix of the law tests in ``properties/``.

Options: ``--impl NAME`` or ``--impl OP=module:callable`` (repeatable; default every registered
implementation), ``--op OP`` (repeatable), ``--precision MODE`` (the mode of implementations that
have a precision knob), ``--device cpu|cuda``, ``--strict-bitwise`` (a law exact in real arithmetic
that holds within budget but not bit for bit fails), and Hypothesis' ``--hypothesis-profile``
(``ci`` by default; ``dev``, ``fuzz``, ``gpu``: see ``refcheck.profiles``).

A test in ``properties/`` is marked ``@pytest.mark.law(NAME)`` and takes the fixtures ``impl`` and
``check_law``: it runs once per selected implementation of every op the law concerns; an
implementation that cannot run here is skipped with its reason (the one legitimate skip).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import pytest

from refcheck import profiles
from refcheck.backend import configure_backend
from refcheck.case import PRECISION_MODES

profiles.register()   # before Hypothesis' plugin loads --hypothesis-profile


def pytest_addoption(parser):
    group = parser.getgroup("refcheck")
    group.addoption("--impl", action="append", default=[], metavar="NAME|OP=module:callable",
                    help="run this implementation (a registered name, or a callable joining the registry "
                         "for OP); repeatable; default: every registered implementation")
    group.addoption("--op", action="append", default=[], metavar="OP", help="run this op only (repeatable)")
    group.addoption("--precision", choices=PRECISION_MODES, default=None,
                    help="precision mode of implementations with a precision knob (default: drawn)")
    group.addoption("--device", choices=("cpu", "cuda"), default=None,
                    help="where kernels run (default: cuda if available, else the CPU interpreter)")
    group.addoption("--strict-bitwise", action="store_true", default=False,
                    help="fail laws exact in real arithmetic (batch invariance, varlen, state chaining, ...) "
                         "that hold within budget but not bit for bit")


@dataclass(frozen=True)
class RefcheckConfig:
    device: str
    ops: tuple[str, ...]
    impls: tuple[str, ...]
    precision: str | None
    strict: bool
    profile: str


CONFIG = pytest.StashKey[RefcheckConfig]()


def pytest_configure(config):
    # Triton reads TRITON_INTERPRET when a kernel is defined: the backend goes first.
    device = configure_backend(config.getoption("--device"))
    if device == "cpu":
        # Tiny tensors: with one OpenMP thread per xdist worker, a [2,200,116] einsum takes 50 us;
        # with 2 threads per worker on 2 busy cores it took 16 ms (measured here).
        import torch
        torch.set_num_threads(1)
    from refcheck import registry
    from refcheck.ops import OPS

    names = []
    for spec in config.getoption("--impl"):
        names.append(registry.register(spec).name if "=" in spec else spec)
    ops = tuple(config.getoption("--op"))
    for op in ops:
        if op not in OPS:
            raise pytest.UsageError(f"--op {op}: unknown op; known ops: {', '.join(OPS)}")
    profile = config.getoption("hypothesis_profile", None) or profiles.DEFAULT
    profiles.load(profile)
    strict = config.getoption("--strict-bitwise") or os.environ.get("REFCHECK_STRICT_BITWISE", "") not in ("", "0")
    config.stash[CONFIG] = RefcheckConfig(device, ops, tuple(names), config.getoption("--precision"), strict,
                                          profile)
    config.addinivalue_line("markers", "law(name): a property test of the law refcheck.laws.LAWS[name]")


def pytest_generate_tests(metafunc):
    """Parametrize a law test over the selected, applicable implementations of the law's ops."""
    if "impl" not in metafunc.fixturenames:
        return
    from refcheck import registry
    from refcheck.laws import law as get_law

    marker = metafunc.definition.get_closest_marker("law")
    if marker is None:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: a test taking `impl` needs @pytest.mark.law(NAME)")
    law = get_law(marker.args[0])
    cfg = metafunc.config.stash[CONFIG]
    params = []
    for op in law.ops:
        if cfg.ops and op not in cfg.ops:
            continue
        for impl in registry.implementations(op):
            if (cfg.impls and impl.name not in cfg.impls) or law.why_not(impl):
                continue
            why = impl.unavailable(cfg.device)
            marks = [pytest.mark.skip(reason=f"{op}/{impl.name} unavailable on {cfg.device}: {why}")] if why else []
            params.append(pytest.param(impl, id=f"{op}-{impl.name}", marks=marks))
    if not params:
        params = [pytest.param(None, id="none", marks=pytest.mark.skip(
            reason=f"law {law.name}: no selected implementation it applies to"))]
    metafunc.parametrize("impl", params)


@pytest.fixture
def check_law(request):
    """``check_law(impl)``: search for a counterexample to the test's law with Hypothesis (the active
    profile); a falsified law fails with its message and reproducer, bitwise differences of laws that
    held within budget become ``BitwiseDifference`` warnings."""
    from refcheck.laws import BitwiseDifference, hypothesis_check, interpreted

    cfg = request.config.stash[CONFIG]
    name = request.node.get_closest_marker("law").args[0]

    def check(impl) -> None:
        mode = cfg.precision if cfg.precision in impl.modes else None
        limits = profiles.limits(cfg.profile, interpreted(impl, cfg.device))
        for note in hypothesis_check(name, impl, limits=limits, mode=mode, device=cfg.device, strict=cfg.strict):
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
