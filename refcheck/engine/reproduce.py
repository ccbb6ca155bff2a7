"""Reproducers: the one-liners every failure prints, and the functions they call.

A reproducer must work where the user stands: for a kernel of their own package (the folder it was
imported from goes on ``sys.path``), for an op of their own (``--op-card``: ``op_cards``), under their
budget files (``--budgets``), with the dtypes and backward they declared. ``law`` reruns one law on one example and
``point`` one grid point; both
raise while the failure is still there (exit status 1), and print that it holds once fixed.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..model import budgets as budgets_mod
from ..model import registry
from ..model.case import Case


def import_root(impl: registry.Implementation) -> str | None:
    """The ``sys.path`` entry the module of a user's implementation was imported from (None for
    refcheck's own implementations and modules it cannot locate)."""
    return module_root(impl.target.partition(":")[0])


def module_root(name: str) -> str | None:
    """The ``sys.path`` entry module ``name`` was imported from (None for refcheck's own modules and
    modules it cannot locate)."""
    top = name.split(".")[0]
    if top in ("refcheck", "references", "optimized"):
        return None
    module = sys.modules.get(name)
    if module is None or not getattr(module, "__file__", None):
        return None
    assert module.__file__ is not None      # checked just above
    path = Path(module.__file__).resolve()
    if path.name == "__init__.py":
        path = path.parent
    for _ in name.split("."):
        path = path.parent
    return str(path)


def impl_arguments(impl: registry.Implementation) -> tuple[str, list[str]]:
    """The implementation as arguments of ``law``/``point``: its spec, and keyword arguments saying
    how a callable given on the command line was declared (dtypes, backward) when not the defaults."""
    from ..model.ops import card
    if impl.target != impl.name:            # registered by name, or a record reachable as module:attr
        return repr(impl.name), []
    keywords = []
    if tuple(impl.dtypes) != tuple(card(impl.op).dtypes):
        keywords.append(f"dtypes={tuple(impl.dtypes)!r}")
    if not impl.backward:
        keywords.append("backward=False")
    return repr(f"{impl.op}={impl.name}"), keywords


def one_liner(function: str, impl: registry.Implementation, arguments: list[str], leading: Sequence[str] = ()) -> str:
    """``python -c "..."`` calling ``refcheck.engine.reproduce.<function>(*leading, impl, *arguments)``, with
    the user's import root and the budget files in force."""
    from ..model.ops import named_cards
    cards = named_cards()
    roots = dict.fromkeys(r for r in [import_root(impl), *(module_root(c.partition(":")[0]) for c in cards)] if r)
    prelude = [f"import sys; sys.path.insert(0, {root!r})" for root in roots]
    paths = budgets_mod.user_paths()
    spec, keywords = impl_arguments(impl)
    args = [*leading, spec, *arguments, *keywords] + ([f"budgets={list(paths)!r}"] if paths else [])
    args += [f"op_cards={cards!r}"] if cards else []
    prelude.append(f"from refcheck.engine.reproduce import {function}; from refcheck.model.case import Case")
    from ..runtime.autotune import reproducer_env
    return f"{reproducer_env()}python -c \"{'; '.join(prelude)}; {function}({', '.join(args)})\""


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
    from .examples import Example
    from .laws import check
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
    from .verify import verify
    implementation, device = _setup(impl, case.op, device, budgets, dtypes, backward, op_cards)
    verdict = verify(implementation, case, mode=mode, device=device, **dict(knobs or {}))
    print(verdict.table())
    if not verdict.passed:
        raise PointFailure(f"{case.op}/{implementation.name}: over budget or off contract on this case")
    return verdict
