"""Implementations of each op, by short name: ours (``triton``), the ``naive`` baseline, the peers.

An implementation is anything with the op's contract signature. Each record says where the
callable lives (imported lazily, so a missing peer costs nothing), which dtypes and devices it
supports, the keyword knobs it exposes (``precision`` is the precision mode of fp32 dots), whether it
has a backward, and which outputs it returns. ``availability`` says why it cannot run here instead
of failing: a peer that is not installed, or a kernel that needs a GPU, is unavailable, not broken.
A user's implementation joins with ``resolve("OP=module:callable")``, which checks that it can be
imported, fits the op's contract signature and asks for dtypes the op has.
"""
from __future__ import annotations

import dataclasses
import inspect

from .case import PRECISION_MODES
from .implementation import ALL_DTYPES, Implementation
from .ops import OPS, card
from .targets import import_target

__all__ = ["ALL_DTYPES", "Implementation", "SpecError", "contract_problems", "get", "implementations", "provides",
           "resolve"]


def provides(impl: Implementation) -> tuple[str, ...]:
    """The contract outputs ``impl`` returns: those it declares (a peer may return fewer, e.g. no
    lse), else every output of its op."""
    return tuple(impl.outputs or card(impl.op).outputs)


def listed(op: str) -> tuple[Implementation, ...]:
    """The implementations an op brings: those its card lists, then its naive forms: recurrent, and
    chunked where the op has a chunk form (``refcheck.model.naive``)."""
    c = card(op)
    naive = Implementation(op, "naive", f"refcheck.model.naive:{op}", dtypes=c.dtypes,
                           description="the reference evaluated in the input dtype")
    chunked = () if c.chunked_reference is None else (Implementation(
        op, "naive_chunked", f"refcheck.model.naive:{op}_chunked", dtypes=c.dtypes,
        description="the chunk form evaluated in the input dtype, decays differenced as kernels do"),)
    return c.implementations + (naive,) + chunked


NAIVE_FORMS = {"recurrent": "naive", "chunked": "naive_chunked"}
"""The naive forms (the reference evaluated in the input dtype) by form, as registered names."""


def naive_forms(op: str) -> tuple[str, ...]:
    """The naive forms of ``op``: recurrent, and chunked where the op has a chunk form."""
    return ("recurrent", "chunked") if card(op).chunked_reference is not None else ("recurrent",)

_brought: dict[str, tuple[Implementation, ...]] = {}
"""What each op's card brings (``listed``), made once per op: ops join ``OPS`` later too (a user's
card, ``refcheck.model.ops.load_user_cards``)."""

_registry: dict[tuple[str, str], Implementation] = {}
"""Implementations named on a command line (``resolve``), by op and name: they take the place of a
brought one of the same name."""


def _all() -> dict[tuple[str, str], Implementation]:
    found = {}
    for op in OPS:
        if op not in _brought:
            _brought[op] = listed(op)
        found.update({(impl.op, impl.name): impl for impl in _brought[op]})
    return {**found, **_registry}


class SpecError(ValueError):
    """An implementation named on a command line that cannot be used: says which and why."""


SPEC_FORMS = ("NAME (registered: triton, naive, naive_chunked, fla_chunk, fla_recurrent, sdpa, fa4; the "
              "family fla names every flash-linear-attention entry point)", "OP=NAME",
              "OP=module:callable", "module:callable (where the op is given)",
              "module:attr naming a refcheck.model.registry.Implementation")
"""The ways to name an implementation: the same in pytest, report, drift and fuzz."""


def contract_problems(fn, op: str, knobs=()) -> list[str]:
    """What keeps ``fn`` from being called as the op's contract calls it (empty when it fits).

    The contract is the signature of the op's float64 reference: its required parameters are passed
    by position, in order, the others (and the implementation's ``knobs``) by keyword. ``fn`` must
    take every one of them (``*args``/``**kwargs`` count), must not take a contract argument at
    another position (a swapped ``g``/``beta`` is a bug, not a style), and must not require more."""
    op_card = card(op)
    contract = list(inspect.signature(op_card.reference).parameters.values())
    by_position = [p.name for p in contract if p.default is p.empty]
    by_keyword = [p.name for p in contract if p.default is not p.empty]
    by_keyword += [k for k in knobs if k not in by_keyword]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check before calling
        return []
    kinds = {p.kind for p in params}
    slots = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems = []
    # an extension's keywords come together: all of them (it is offered) or none (declined: left out of calls)
    names = {p.name for p in params}
    for ext in op_card.extensions:
        taken = [k for k in ext.keywords if k in names]
        if inspect.Parameter.VAR_KEYWORD in kinds or not taken:
            if not taken:
                by_keyword = [k for k in by_keyword if k not in ext.keywords]
            continue
        missing = [k for k in ext.keywords if k not in names]
        if missing:
            problems.append(f"takes {', '.join(map(repr, taken))} but not {', '.join(map(repr, missing))}: the "
                            f"keywords of extension {ext.name!r} come together (all of them, or none to decline it)")
            by_keyword = [k for k in by_keyword if k not in missing]
    for i, name in enumerate(by_position):
        if i < len(slots):
            got = slots[i].name
            if got != name and got in by_position + by_keyword:
                problems.append(f"argument {i + 1} is {got!r} where the contract passes {name!r} "
                                f"(positional order: {', '.join(by_position)})")
        elif inspect.Parameter.VAR_POSITIONAL not in kinds:
            problems.append(f"missing argument {name!r} (the contract passes {', '.join(by_position)} by position)")
    named = {p.name: p for p in params}
    for name in by_keyword:
        p = named.get(name)
        if p is None and inspect.Parameter.VAR_KEYWORD not in kinds:
            problems.append(f"missing argument {name!r} (the contract passes it by keyword)")
        elif p is not None and p.kind is p.POSITIONAL_ONLY:
            problems.append(f"argument {name!r} is positional-only; the contract passes it by keyword")
        elif p is not None and p in slots[:len(by_position)]:
            problems.append(f"argument {name!r} takes a positional slot the contract fills with "
                            f"{by_position[slots.index(p)]!r}")
    for p in params:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        passed = p.name in by_keyword or (p in slots and slots.index(p) < len(by_position))
        if required and not passed:
            problems.append(f"extra required argument {p.name!r}: the contract never passes it")
    return problems


def _import(spec: str, target: str):
    """The object ``target`` ("module:attr") names (``targets.import_target``)."""
    return import_target(target, where=f"--impl {spec!r}", error=SpecError,
                         expected="module:callable (e.g. mykernels.gla:chunk_gla)")


def resolve(spec: str, op: str | None = None, *, dtypes: tuple[str, ...] | None = None,
            backward: bool = True, isolated: bool = False) -> list[Implementation]:
    """The implementations ``spec`` names (see ``SPEC_FORMS``), of ``op`` when given: a registered
    name (every op's, without ``op``), ``OP=...``, a ``module:callable`` with the op's contract
    signature (registered for this run under the name ``module:callable``; a family name such as
    ``fla`` names every member; ``dtypes`` and
    ``backward`` describe it), or ``module:attr`` naming an ``Implementation`` record. Anything that
    cannot be used (unknown op or name, a module that does not import, a signature that does not
    fit the contract, a dtype the op does not have) raises ``SpecError`` saying why. ``isolated``: the
    implementations run in a process of their own (``Implementation.isolated``), and a ``module:callable`` is
    imported there only, never in this process (its signature comes from there)."""
    given_op, sep, rest = spec.partition("=")
    if sep:
        if op is not None and given_op != op:
            raise SpecError(f"--impl {spec!r}: names op {given_op!r}, but the op here is {op!r}")
        op = given_op
    else:
        rest = spec
    if op is not None and op not in OPS:
        raise SpecError(f"--impl {spec!r}: unknown op {op!r}; known ops: {', '.join(OPS)}")
    if ":" not in rest:
        found = [i for i in implementations(op) if rest in (i.name, i.family)]
        if not found:
            names = sorted({i.name for i in implementations(op)})
            raise SpecError(f"--impl {spec!r}: no implementation {rest!r}{f' of {op}' if op else ''}; registered: "
                            f"{', '.join(names)}; or name your own as {' | '.join(SPEC_FORMS[1:4])}")
        if isolated:
            found = [dataclasses.replace(i, isolated=True) for i in found]
            _registry.update({(i.op, i.name): i for i in found})
        return found
    obj = _isolated(spec, rest) if isolated else _import(spec, rest)
    if isolated and obj.record is not None:      # a record: it describes the callable its process already runs
        proxy = obj
        obj.record.__dict__.pop("fn", None)
        obj = dataclasses.replace(obj.record, isolated=True)
        obj.__dict__["fn"] = proxy
    if isinstance(obj, Implementation):
        if op is not None and obj.op != op:
            raise SpecError(f"--impl {spec!r}: that is an implementation of {obj.op}, not of {op}")
        impl = obj
    elif callable(obj):
        if op is None:
            raise SpecError(f"--impl {spec!r}: which op does it implement? write OP={rest} "
                            f"(ops: {', '.join(OPS)})")
        takes_precision = "precision" in _parameters(obj)
        impl = Implementation(op, rest, rest, dtypes=tuple(dtypes or card(op).dtypes),
                              knobs={"precision": PRECISION_MODES} if takes_precision else {},
                              backward=backward, description="named on the command line", isolated=isolated)
        if isolated:
            impl.__dict__["fn"] = obj      # the process started for its signature serves its calls
    else:
        raise SpecError(f"--impl {spec!r}: {rest.partition(':')[2]!r} is a {type(obj).__name__}, not a callable")
    bad = [d for d in impl.dtypes if d not in card(impl.op).dtypes]
    if bad:
        raise SpecError(f"--impl {spec!r}: {impl.op} has no {', '.join(bad)} inputs "
                        f"(its dtypes: {', '.join(card(impl.op).dtypes)})")
    try:
        problems = contract_problems(impl.fn, impl.op, list(impl.knobs))
    except Exception as err:
        raise SpecError(f"--impl {spec!r}: cannot load {impl.target}: {type(err).__name__}: {err}") from None
    unknown = [n for n in impl.declines if n not in {e.name for e in card(impl.op).extensions}]
    if unknown:
        problems.append(f"declines {', '.join(map(repr, unknown))}, which {impl.op} does not have as extensions "
                        f"({', '.join(e.name for e in card(impl.op).extensions) or 'it has none'})")
    if problems:
        raise SpecError(f"--impl {spec!r}: signature {inspect.signature(impl.fn)} does not fit the {impl.op} contract "
                        f"{inspect.signature(card(impl.op).reference)}:\n  " + "\n  ".join(problems))
    _registry[(impl.op, impl.name)] = impl
    return [impl]


def _isolated(spec: str, target: str):
    """``target`` in a process of its own (``refcheck.runtime.candidate.isolated``): a callable with its signature."""
    from ..runtime import candidate
    try:
        return candidate.isolated(target, candidate.interpreted_here())
    except Exception as err:
        raise SpecError(f"--impl {spec!r}: cannot load {target} in a process of its own: {type(err).__name__}: "
                        f"{str(err).splitlines()[0]}") from None


def _parameters(fn) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def implementations(op: str | None = None) -> list[Implementation]:
    """Every registered implementation (of ``op``): those the cards bring, then those named."""
    return [i for i in _all().values() if op is None or i.op == op]


def get(op: str, name: str) -> Implementation:
    try:
        return _all()[(op, name)]
    except KeyError:
        names = ", ".join(i.name for i in implementations(op))
        raise ValueError(f"no implementation {name!r} of {op}; registered: {names}") from None
