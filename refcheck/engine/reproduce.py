"""Reproducers: the functions the one-liners every failure prints call (``refcheck.engine.oneliner`` writes them).

A reproducer must work where the user stands: for a kernel of their own package (the folder it was
imported from goes on ``sys.path``), for an op of their own (``--op-card``: ``op_cards``), under their
budget files (``--budgets``), with the dtypes and backward they declared. ``law`` reruns one law on one example
and ``point`` one grid point; both raise while the failure is still there (exit status 1), and print that it
holds once fixed.
"""
from __future__ import annotations

from ..model import budgets as budgets_mod
from ..model import registry
from ..model.case import Case
from .examples import Example
from .laws import check
from .verify import verify


def _setup(impl: str, op: str, device: str | None, budgets, dtypes, backward,
           op_cards=()) -> tuple[registry.Implementation, str]:
    from ..model.ops import load_user_cards
    from ..runtime.backend import configure_backend
    load_user_cards(list(op_cards))          # a user's op first: the budgets name it
    budgets_mod.use(budgets or ())
    device = configure_backend(device)   # before the implementation's kernels are imported
    found = registry.resolve(impl, op, dtypes=dtypes, backward=backward)
    return found[0].on(device), device


def law(law_name: str, impl: str, case: Case, *, mode: str | None = None, knobs: dict | None = None,
        params: dict | None = None, device: str | None = None, strict: bool = False, budgets=(),
        dtypes: tuple[str, ...] | None = None, backward: bool = True, op_cards=()):
    """Rerun one law on one example, as a failure message prints it: raises ``LawViolation`` again
    if it still fails, else prints that the law holds and returns the ``Outcome``."""
    implementation, device = _setup(impl, case.op, device, budgets, dtypes, backward, op_cards)
    example = Example(case, mode or implementation.modes[0], dict(knobs or {}), dict(params or {}))
    outcome = check(law_name, implementation, example, device=device, strict=strict)
    print(f"law {law_name} holds for {case.op}/{implementation.name} on this example"
          + "".join(f"\n  note: {n}" for n in outcome.notes))
    return outcome


class PointFailure(AssertionError):
    """A grid point (one implementation on one case) is over budget or broke its contract."""


def point(impl: str, case: Case, *, mode: str | None = None, knobs: dict | None = None, device: str | None = None,
          budgets=(), dtypes: tuple[str, ...] | None = None, backward: bool = True, op_cards=()):
    """Measure one implementation on one case (``verify.verify``), print the verdict table, and
    raise ``PointFailure`` while anything is over budget."""
    implementation, device = _setup(impl, case.op, device, budgets, dtypes, backward, op_cards)
    verdict = verify(implementation, case, mode=mode, device=device, **dict(knobs or {}))
    print(verdict.table())
    if not verdict.passed:
        raise PointFailure(f"{case.op}/{implementation.name}: over budget or off contract on this case")
    return verdict
