"""The one-liners every failure prints: ``python -c "..."`` calling ``refcheck.engine.reproduce``, with what
it needs where the user stands (the folder their kernel was imported from on ``sys.path``, their op cards,
their budget files). The laws and the verdicts import this module; the functions the one-liners call
(``refcheck.engine.reproduce``) import the laws and the verdicts, so that the layers read top to bottom.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..model import budgets as budgets_mod
from ..model import registry


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
