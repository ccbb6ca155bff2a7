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
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import torch

from .case import PRECISION_MODES
from .ops import OPS, card

ALL_DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Implementation:
    """One implementation of one op.

    target:   ``"module:callable"``, imported on first use
    devices:  device types it runs on; a Triton kernel on "cpu" runs through the faithful interpreter
    knobs:    keyword knobs and the values to exercise (``precision`` -> precision modes)
    backward: it is differentiable (gradients are checked)
    outputs:  the contract outputs it returns (a peer may return fewer, e.g. no lse)
    requires: the module a peer's adapter imports on call (checked for availability)
    fixed_mode: for an implementation without a ``precision`` knob, the mode its fp32 dots always run
              at (a Triton ``tl.dot`` on fp32 defaults to tf32), so that it is judged by that mode's
              budgets; default "ieee" (plain fp32)
    family:   a name that selects it with others (``--impl fla``: every flash-linear-attention entry point)
    backward_refusal: ``"module:callable"``, called with the device and a case (None: any), returning
              why the backward is refused there (a peer's own refusal of a GPU or compiler version:
              checked forward only there, ``on``, ``forward_only_because`` saying why) or on that
              case (an input combination it states it does not differentiate: that case is checked
              forward only), or None
    dim_multiple: by input dtype, the number its head dims must be a multiple of (a restriction it
              states and asserts): cases for it are drawn with such head dims in that dtype
    """

    op: str
    name: str
    target: str
    dtypes: tuple[str, ...] = ALL_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    knobs: Mapping[str, tuple] = field(default_factory=dict)
    backward: bool = True
    outputs: tuple[str, ...] | None = None
    triton: bool = False
    requires: str | None = None
    fixed_mode: str = "ieee"
    family: str | None = None
    dim_multiple: Mapping[str, int] = field(default_factory=dict)
    backward_refusal: str | None = None
    forward_only_because: str | None = None
    description: str = ""

    def __post_init__(self):
        if self.fixed_mode not in PRECISION_MODES:
            raise ValueError(f"fixed_mode: expected one of {PRECISION_MODES}, got {self.fixed_mode!r}")

    def __getstate__(self) -> dict:
        """Pickled without the imported callable (a worker process imports ``target`` itself: a
        callable reached through another name does not pickle)."""
        return {k: v for k, v in self.__dict__.items() if k != "fn"}

    @cached_property
    def fn(self) -> Callable:
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def modes(self) -> tuple[str, ...]:
        """Precision modes it can be asked for; without the knob, its ``fixed_mode``."""
        return tuple(self.knobs.get("precision", (self.fixed_mode,)))

    @property
    def provides(self) -> tuple[str, ...]:
        return self.outputs or card(self.op).outputs

    def refused_backward(self, device: str, case=None) -> str | None:
        """Why its backward is refused on ``device`` (``case`` None) or on ``case`` there
        (``backward_refusal``), or None."""
        if not self.backward or self.backward_refusal is None:
            return None
        module, _, attr = self.backward_refusal.partition(":")
        return getattr(importlib.import_module(module), attr)(device, case)

    def on(self, device: str) -> "Implementation":
        """This implementation as it runs on ``device``: forward only where its backward is refused."""
        why = self.refused_backward(device) if self.unavailable(device) is None else None
        if why is None:
            return self
        return dataclasses.replace(self, backward=False, forward_only_because=why)

    def unavailable(self, device: str) -> str | None:
        """Why it cannot run on ``device`` here, or None when it can."""
        kind = torch.device(device).type
        if kind not in self.devices:
            return f"runs on {'/'.join(self.devices)} only"
        if kind == "cuda" and not torch.cuda.is_available():
            return "no CUDA device here"
        if self.triton and kind == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "Triton kernel on the CPU needs TRITON_INTERPRET=1 (refcheck sets it)"
        if self.requires and importlib.util.find_spec(self.requires.partition(".")[0]) is None:
            return f"{self.requires} is not installed"
        try:
            self.fn
        except Exception as err:  # an uninstalled peer or a broken import: report, don't crash
            return f"cannot import {self.target}: {type(err).__name__}: {err}"
        return None


TRITON_KNOBS = {"precision": PRECISION_MODES, "use_gather": (True, False), "disable_recompute": (False, True)}

BUILTIN: tuple[Implementation, ...] = (
    Implementation("kda_gate", "triton", "optimized:kda_gate", triton=True,
                   description="our Triton gate kernel"),
    Implementation("kda", "triton", "optimized:kda", knobs=TRITON_KNOBS, triton=True,
                   description="our chunked Triton KDA (chunk 64, WY solve)"),
    # flash-linear-attention's Triton kernels run on the CPU through the faithful interpreter. There
    # fla.utils finds no GPU ("roll back to CPU"): no TF32 (chunk_kda's solve_tril dots run ieee, tf32
    # on Hopper) and no large shared memory (smaller BK/BV autotune lists): the kernels FLA would
    # launch on such a GPU, judged by the same budgets.
    Implementation("kda", "fla_chunk", "refcheck.peers:fla_kda", triton=True, requires="fla",
                   fixed_mode="tf32", family="fla", description="flash-linear-attention chunk_kda"),
    Implementation("gla", "fla_chunk", "refcheck.peers:fla_gla", triton=True, requires="fla",
                   fixed_mode="tf32", family="fla", description="flash-linear-attention chunk_gla"),
    # its backward asserts even K and V in 16-bit ("Triton miscompiles masked K-tail iterations", fla-core 0.6.0)
    Implementation("simple_gla", "fla_chunk", "refcheck.peers:fla_simple_gla", triton=True, requires="fla",
                   fixed_mode="tf32", family="fla", dim_multiple={"bf16": 2, "fp16": 2},
                   backward_refusal="refcheck.peers:fla_gated_chunk_backward_refusal",
                   description="flash-linear-attention chunk_simple_gla"),
    Implementation("kda", "fla_recurrent", "refcheck.peers:fla_recurrent_kda", triton=True, requires="fla",
                   backward=False, family="fla", description="flash-linear-attention fused_recurrent_kda (no backward)"),
    Implementation("gla", "fla_recurrent", "refcheck.peers:fla_recurrent_gla", triton=True, requires="fla",
                   family="fla", description="flash-linear-attention fused_recurrent_gla"),
    Implementation("simple_gla", "fla_recurrent", "refcheck.peers:fla_recurrent_simple_gla", triton=True,
                   requires="fla", family="fla", description="flash-linear-attention fused_recurrent_simple_gla"),
    Implementation("attention", "sdpa", "refcheck.peers:sdpa_attention", outputs=("o",),
                   description="torch scaled_dot_product_attention (no lse)"),
    # "head_dim and head_dim_v must be between 8 and 256 and divisible by 8" (flash-attn-4 4.0.0b36 on SM90)
    Implementation("attention", "fa4", "refcheck.peers:fa4_attention", devices=("cuda",), dtypes=("bf16", "fp16"),
                   requires="flash_attn", dim_multiple={"bf16": 8, "fp16": 8},
                   backward_refusal="refcheck.peers:fa4_backward_refusal", description="flash-attn-4 (CUTLASS DSL)"),
) + tuple(
    Implementation(op, "naive", f"refcheck.naive:{op}", dtypes=OPS[op].dtypes if op != "attention" else ALL_DTYPES,
                   description="the reference evaluated in the input dtype")
    for op in OPS
) + tuple(
    Implementation(op, "naive_chunked", f"refcheck.naive:{op}_chunked", dtypes=OPS[op].dtypes,
                   description="the chunk form evaluated in the input dtype, decays differenced as kernels do")
    for op in OPS if OPS[op].chunked_reference is not None
)

NAIVE_FORMS = {"recurrent": "naive", "chunked": "naive_chunked"}
"""The naive forms (the reference evaluated in the input dtype) by form, as registered names."""


def naive_forms(op: str) -> tuple[str, ...]:
    """The naive forms of ``op``: recurrent, and chunked where the op has a chunk form."""
    return ("recurrent", "chunked") if card(op).chunked_reference is not None else ("recurrent",)

_registry: dict[tuple[str, str], Implementation] = {(i.op, i.name): i for i in BUILTIN}


class SpecError(ValueError):
    """An implementation named on a command line that cannot be used: says which and why."""


SPEC_FORMS = ("NAME (registered: triton, naive, naive_chunked, fla_chunk, fla_recurrent, sdpa, fa4; the "
              "family fla names every flash-linear-attention entry point)", "OP=NAME",
              "OP=module:callable", "module:callable (where the op is given)",
              "module:attr naming a refcheck.registry.Implementation")
"""The ways to name an implementation: the same in pytest, report, drift and fuzz."""


def contract_problems(fn, op: str, knobs=()) -> list[str]:
    """What keeps ``fn`` from being called as the op's contract calls it (empty when it fits).

    The contract is the signature of the op's float64 reference: its required parameters are passed
    by position, in order, the others (and the implementation's ``knobs``) by keyword. ``fn`` must
    take every one of them (``*args``/``**kwargs`` count), must not take a contract argument at
    another position (a swapped ``g``/``beta`` is a bug, not a style), and must not require more."""
    contract = list(inspect.signature(card(op).reference).parameters.values())
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
    """The object ``target`` ("module:attr") names; the working directory is importable first, as
    with ``python -m``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SpecError(f"--impl {spec!r}: expected module:callable (e.g. mykernels.gla:chunk_gla)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # not found, or the module itself fails to import
        raise SpecError(f"--impl {spec!r}: cannot import module {module_name!r}: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise SpecError(f"--impl {spec!r}: module {module_name!r} ({module.__file__}) has no attribute {attr!r}")
    return getattr(module, attr)


def resolve(spec: str, op: str | None = None, *, dtypes: tuple[str, ...] | None = None,
            backward: bool = True) -> list[Implementation]:
    """The implementations ``spec`` names (see ``SPEC_FORMS``), of ``op`` when given: a registered
    name (every op's, without ``op``), ``OP=...``, a ``module:callable`` with the op's contract
    signature (registered for this run under the name ``module:callable``; a family name such as
    ``fla`` names every member; ``dtypes`` and
    ``backward`` describe it), or ``module:attr`` naming an ``Implementation`` record. Anything that
    cannot be used (unknown op or name, a module that does not import, a signature that does not
    fit the contract, a dtype the op does not have) raises ``SpecError`` saying why."""
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
        return found
    obj = _import(spec, rest)
    if isinstance(obj, Implementation):
        if op is not None and obj.op != op:
            raise SpecError(f"--impl {spec!r}: that is an implementation of {obj.op}, not of {op}")
        impl = obj
    elif callable(obj):
        if op is None:
            raise SpecError(f"--impl {spec!r}: which op does it implement? write OP={rest} "
                            f"(ops: {', '.join(OPS)})")
        takes_precision = "precision" in _parameters(obj)
        impl = Implementation(op, rest, rest, dtypes=tuple(dtypes or (d for d in card(op).dtypes if d != "fp8")),
                              knobs={"precision": PRECISION_MODES} if takes_precision else {},
                              backward=backward, description="named on the command line")
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
    if problems:
        raise SpecError(f"--impl {spec!r}: signature {inspect.signature(impl.fn)} does not fit the {impl.op} contract "
                        f"{inspect.signature(card(impl.op).reference)}:\n  " + "\n  ".join(problems))
    _registry[(impl.op, impl.name)] = impl
    return [impl]


def _parameters(fn) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def implementations(op: str | None = None) -> list[Implementation]:
    """Every registered implementation (of ``op``), in registration order."""
    return [i for i in _registry.values() if op is None or i.op == op]


def get(op: str, name: str) -> Implementation:
    try:
        return _registry[(op, name)]
    except KeyError:
        names = ", ".join(i.name for i in implementations(op))
        raise ValueError(f"no implementation {name!r} of {op}; registered: {names}") from None
