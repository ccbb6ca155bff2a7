"""Op records (cards): the one place where refcheck learns an op.

Each op is one module here holding its ``CARD`` (``refcheck.model.ops.card.OpCard``: contract, float64
truth, inputs, case strategy, grid, traits, implementations); its reference lives in
``references/``, its kernels (ours) in ``optimized/``, its budgets in ``tolerances.toml``. A module
of this package that defines ``CARD`` is an op: nothing else needs to name it.

A kernel author's own op joins without editing refcheck: an ``OpCard`` named ``module:attr`` in
``--op-card`` (pytest and every command) or ``REFCHECK_OP_CARDS`` (comma-separated), or published by
their package under the entry point group ``refcheck.ops``. ``load_user_cards`` registers them.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
from importlib.metadata import entry_points

from ..targets import import_target
from .card import GRAD_NAMES, REQUIREMENTS, TRAITS, Extension, Grouping, Inputs, OpCard, Paging, ReturnError

__all__ = ["GRAD_NAMES", "OPS", "REQUIREMENTS", "TRAITS", "Extension", "Grouping", "Inputs", "OpCard", "Paging",
           "ReturnError",
           "card", "load_user_cards", "named_cards", "register"]

CARDS_ENV = "REFCHECK_OP_CARDS"
ENTRY_POINT_GROUP = "refcheck.ops"

OPS: dict[str, OpCard] = {}
"""Every known op's card, by name: the built-in ones (modules of this package, by name), then the
user's (``register``)."""


def register(op_card: OpCard, *, origin: str = "") -> OpCard:
    """Add ``op_card`` to ``OPS``; a name already taken by another card is an error (naming both)."""
    if not isinstance(op_card, OpCard):
        raise ValueError(f"op card{f' {origin}' if origin else ''}: expected a refcheck.model.ops.OpCard, "
                         f"got {type(op_card).__name__}")
    known = OPS.get(op_card.name)
    if known is not None and known is not op_card:
        raise ValueError(f"op card{f' {origin}' if origin else ''}: an op named {op_card.name!r} is already known")
    problems = op_card.problems()
    if problems:
        raise ValueError(f"op card{f' {origin}' if origin else ''}: " + "; ".join(problems))
    OPS[op_card.name] = op_card
    return op_card


def _builtin() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "CARD", None), OpCard):
            register(module.CARD, origin=f"{module.__name__}:CARD")


def _load(spec: str) -> OpCard:
    where = f"--op-card {spec!r}"
    return register(import_target(spec, where=where, expected="module:attr naming a refcheck.model.ops.OpCard"),
                    origin=where)


def load_user_cards(specs: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Register the user's op cards: those published under the entry point group ``refcheck.ops``,
    those named in ``REFCHECK_OP_CARDS`` and ``specs`` (``module:attr``); loading one twice is
    harmless. Returns their names; a card that cannot be loaded is a ``ValueError`` naming it. The
    specs given are exported to ``REFCHECK_OP_CARDS``, so that worker processes, which load the
    published and exported cards when they import this package, know the same ops."""
    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            names.append(register(ep.load(), origin=f"entry point {ep.name} = {ep.value}").name)
        except Exception as err:  # the user's package fails to import: say which entry point
            raise ValueError(f"op card of entry point {ep.name} = {ep.value}: {type(err).__name__}: {err}") from None
    given = named_cards() + [s for s in specs if s]
    for spec in dict.fromkeys(given):
        names.append(_load(spec).name)
    if given:
        os.environ[CARDS_ENV] = ",".join(dict.fromkeys(given))
    return names


def named_cards() -> list[str]:
    """The ``module:attr`` of every user's card named in this process (``REFCHECK_OP_CARDS``)."""
    return [s for s in os.environ.get(CARDS_ENV, "").split(",") if s]


def card(op: str) -> OpCard:
    """The card of ``op``; a clear error for an unknown name."""
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; known ops: {', '.join(OPS)}") from None


_builtin()
load_user_cards()
