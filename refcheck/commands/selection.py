"""What a run is asked to check, from the user's words: the same options, spelled the same way and
checked the same way, in pytest and in every command (report, drift record, fuzz).

    --impl SPEC      an implementation (``registry.SPEC_FORMS``: NAME, OP=NAME, OP=module:callable,
                     module:callable where the op is given, module:attr naming a record)
    --op OP          an op
    --op-card M:A    an op refcheck does not know: its record (``refcheck.model.ops.OpCard``), module:attr
    --dtype DT       an input dtype, refcheck's short name (fp32, bf16) or torch's (float32, torch.bfloat16,
                     half); a callable given with --impl takes only these
    --budgets FILE   a budgets file layered over the defaults
    --device DEV     cpu (the faithful Triton interpreter) or cuda
    --forward-only   a callable given with --impl has no backward

Every list option is repeatable, and each value may itself be a comma-separated list
(``--op kda,gla`` = ``--op kda --op gla``). ``select`` validates everything before any kernel runs:
the user's op cards first, then budget files, then the device (the Triton interpreter must be on before a kernel module is
imported), ops, dtypes and implementations. A named implementation that cannot be used here is a
``SelectionError`` (a usage error, exit status 2), never a skip.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..model import budgets as budgets_mod
from ..model import registry
from ..model.case import DTYPE_NAMES, DTYPES

HELP = {
    "impl": "an implementation: NAME, OP=NAME, OP=module:callable, or module:callable where the op is given "
            "(repeatable, or comma-separated); default: every registered one",
    "op": "only this op (repeatable, or comma-separated)",
    "op_card": "an op refcheck does not know: module:attr naming its refcheck.model.ops.OpCard (repeatable, or "
               "comma-separated); a package may also publish it under the entry point group refcheck.ops",
    "dtype": "only these input dtypes: fp32, bf16, fp16 or torch's names (float32, torch.bfloat16, half, ...); "
             "repeatable, or comma-separated; a callable given with --impl takes only these",
    "budgets": "a budgets file layered over refcheck's defaults (repeatable; later files win)",
    "device": "cpu (the faithful Triton interpreter) or cuda (default: cuda if available)",
    "forward_only": "a callable given with --impl has no backward: no gradients are checked",
}


class SelectionError(ValueError):
    """A usage error in what a run was asked to check; the message names the option."""


@dataclass(frozen=True)
class Selection:
    """A validated selection: the device, the ops (all when none named), the implementations named
    (all registered ones when none) and the dtypes (all when none)."""

    device: str
    ops: tuple[str, ...]
    named: tuple[registry.Implementation, ...]
    dtypes: tuple[str, ...]

    def implementations(self, op: str) -> list[registry.Implementation]:
        """The implementations of ``op`` this run checks."""
        if self.ops and op not in self.ops:
            return []
        if self.named:
            return [i for i in self.named if i.op == op]
        return registry.implementations(op)

    def dtypes_of(self, impl: registry.Implementation) -> tuple[str, ...]:
        """The input dtypes drawn for ``impl``: its own, narrowed by ``--dtype``."""
        return tuple(d for d in impl.dtypes if not self.dtypes or d in self.dtypes)

    def narrowed(self, impl: registry.Implementation) -> registry.Implementation | None:
        """``impl`` as it runs on the device (``Implementation.on``), drawing only the selected dtypes;
        None when it takes none of them."""
        impl = impl.on(self.device)
        dtypes = self.dtypes_of(impl)
        if not dtypes:
            return None
        return impl if dtypes == tuple(impl.dtypes) else dataclasses.replace(impl, dtypes=dtypes)


def items(values: Iterable[str] | None) -> list[str]:
    """Repeated option values, each possibly comma-separated, flattened in order."""
    return [part.strip() for value in values or () for part in value.split(",") if part.strip()]


TORCH_ALIASES = ("half", "float", "double")
"""torch's other names of its dtypes (``torch.half is torch.float16``)."""


def dtype_aliases() -> dict[str, str]:
    """torch's names of refcheck's dtypes, bare and with ``torch.`` (``float32``, ``torch.bfloat16``,
    ``half``, ...) -> the short name of ``DTYPES``."""
    names = {str(dt).removeprefix("torch."): short for short, dt in DTYPES.items()}
    names.update({alias: DTYPE_NAMES[getattr(torch, alias)] for alias in TORCH_ALIASES})
    return {**names, **{f"torch.{name}": short for name, short in names.items()}}


def dtype_name(text: str, option: str = "--dtype") -> str:
    """The short name (``DTYPES``: ``fp32``, ``bf16``, ...) of a dtype given by that name or by torch's
    (``float32``, ``torch.bfloat16``, ``half``); ``SelectionError`` names the option and the known names."""
    if text in DTYPES:
        return text
    aliases = dtype_aliases()
    if text in aliases:
        return aliases[text]
    torch_names = ", ".join(str(dt).removeprefix("torch.") for dt in DTYPES.values())
    raise SelectionError(f"{option} {text}: unknown dtype; expected one of {', '.join(DTYPES)} "
                         f"or torch's names ({torch_names}, half, float, double; with or without 'torch.')")


def add_options(parser, *, impl: bool = True, op: bool = True, dtype: bool = True, device: bool = True,
                budgets: bool = True, op_card: bool = True) -> None:
    """Add the shared options to an argparse parser (the pytest plugin adds the same by hand)."""
    if impl:
        parser.add_argument("--impl", action="append", default=[], metavar="SPEC", help=HELP["impl"])
        parser.add_argument("--forward-only", action="store_true", help=HELP["forward_only"])
    if op:
        parser.add_argument("--op", action="append", default=[], metavar="OP", help=HELP["op"])
    if op_card:
        parser.add_argument("--op-card", action="append", default=[], metavar="MODULE:ATTR", help=HELP["op_card"])
    if dtype:
        parser.add_argument("--dtype", action="append", default=[], metavar="DT", help=HELP["dtype"])
    if budgets:
        parser.add_argument("--budgets", action="append", default=[], metavar="FILE", help=HELP["budgets"])
    if device:
        parser.add_argument("--device", default=None, choices=("cpu", "cuda"), help=HELP["device"])


def load_op_cards(op_cards: Iterable[str] = ()) -> None:
    """Register the user's op cards (``refcheck.model.ops.load_user_cards``); ``SelectionError`` names one
    that cannot be loaded."""
    from ..model.ops import load_user_cards
    try:
        load_user_cards(items(op_cards))
    except ValueError as err:
        raise SelectionError(str(err)) from None


def select(*, impls: Iterable[str] = (), ops: Iterable[str] = (), dtypes: Iterable[str] = (),
           budgets: Iterable[str] = (), device: str | None = None, forward_only: bool = False,
           require_available: bool = True, op_cards: Iterable[str] = (), isolated: bool = False) -> Selection:
    """Validate a run's selection (see the module docstring); ``SelectionError`` says what is wrong.
    With ``require_available`` a named implementation that cannot run on the device is an error."""
    from ..model.ops import OPS
    from ..runtime.backend import configure_backend

    load_op_cards(op_cards)
    try:
        loaded = budgets_mod.use(items(budgets))
    except budgets_mod.BudgetError as err:
        raise SelectionError(f"budgets: {err}") from None
    try:
        device = configure_backend(device)
    except ValueError as err:
        raise SelectionError(f"--device: {err}") from None
    op_names = tuple(dict.fromkeys(items(ops)))
    for name in op_names:
        if name not in OPS:
            raise SelectionError(f"--op {name}: unknown op; known ops: {', '.join(OPS)}")
    dtype_names = tuple(dict.fromkeys(dtype_name(name) for name in items(dtypes)))
    for op in op_names:
        if dtype_names and not set(dtype_names) & set(OPS[op].dtypes):
            raise SelectionError(f"--dtype {','.join(dtype_names)}: {op} has no such inputs "
                                 f"(its dtypes: {', '.join(OPS[op].dtypes)})")
    hint = op_names[0] if len(op_names) == 1 else None
    named: list[registry.Implementation] = []
    for spec in items(impls):
        try:
            found = registry.resolve(spec, hint, dtypes=dtype_names or None, backward=not forward_only,
                                     isolated=isolated)
        except registry.SpecError as err:
            raise SelectionError(str(err)) from None
        found = [i for i in found if not op_names or i.op in op_names]
        if not found:
            raise SelectionError(f"--impl {spec}: implements none of the ops selected ({', '.join(op_names)})")
        for impl in found:
            why = impl.unavailable(device)
            if why and require_available:
                raise SelectionError(f"--impl {spec}: {impl.op}/{impl.name} cannot run on {device}: {why}")
            if dtype_names and not set(dtype_names) & set(impl.dtypes):
                raise SelectionError(f"--dtype {','.join(dtype_names)}: {impl.op}/{impl.name} takes "
                                     f"{', '.join(impl.dtypes)} only")
        named += [i for i in found if i not in named]
    for impl in named:
        missing = [f"{impl.op}.{output}.{dtype}" for dtype in impl.dtypes if not dtype_names or dtype in dtype_names
                   for output in OPS[impl.op].budget_outputs if not loaded.has(impl.op, output, dtype)]
        if missing:
            raise SelectionError(f"--impl {impl.op}/{impl.name}: no budget for {', '.join(missing[:4])}"
                                 f"{' ...' if len(missing) > 4 else ''}: give one with --budgets FILE")
    return Selection(device, op_names, tuple(named), dtype_names)
