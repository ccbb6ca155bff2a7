"""The op record (card): everything refcheck knows about one op, in one value.

In the spirit of PyTorch's OpInfo, smaller: a card holds the op's contract and float64 truth, how its
inputs are made from a ``Case``, how Hypothesis draws its cases, its grid, its traits and the hooks
those traits need, and its implementations. Generic code (laws, strategies, grid, report, drift,
fuzz, budgets) reads cards and never names an op: a law chooses its ops by trait (``Law.needs``).

Traits (``TRAITS``) and what a card that claims one must provide (``OpCard.problems``):

    varlen         packed sequences through ``cu_seqlens``: ``empty_outputs`` (what a sequence
                   without tokens returns). Requirements ``varlen``, ``min_seqs``.
    state          a recurrent state: ``initial_state`` input, ``final_state`` output, the
                   ``output_final_state`` option.
    causal         an output at a position depends on no later position: ``causal`` (whether a
                   case is causal) and ``after`` (the positions, per token axis, after a cut).
                   Requirement ``causal``.
    decay_gate     a log-decay gate input ``g`` whose dtype is drawn apart (``Case.draw``'s
                   ``gate_dtype``). Requirement ``gate_dtype``.
    keys           a key sequence apart from the queries (dims ``S``, ``Case.seqlens_k``): ``unseen``
                   (the keys a query row does not see). Requirements ``min_keys``,
                   ``rows_without_keys``, ``window``, ``sinks``.
    gate_function  the op is a gate: output ``gate``, option ``lower_bound``.
    grouped_heads  heads of one kind shared by groups of another (attention's GQA, gated_delta_rule's
                   grouped value heads): ``grouping``. Requirement ``grouped``.

Requirements (``REQUIREMENTS``) are the one vocabulary in which laws ask for cases: the same words
draw a case (keyword arguments of ``OpCard.cases``) and check a fixed one (``OpCard.meets``).
"""
from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ..case import Case
from ..implementation import Implementation

GRAD_NAMES = {"initial_state": "dh0"}
"""Gradient output names are ``d`` + input name, except where listed here."""


class ReturnError(TypeError):
    """What an implementation returned is not what the contract returns (``OpCard.split``): a verdict on
    the implementation, as a wrong value is, never a crash of the check."""


@dataclass
class Inputs:
    """Tensors and options of one call of an op.

    tensors:    every tensor argument by name (positional ones and keyword ones such as cu_seqlens)
    positional: the names passed positionally, in order
    options:    non-tensor keyword arguments
    """

    tensors: dict[str, torch.Tensor]
    positional: tuple[str, ...]
    options: dict[str, Any]

    def call(self, fn: Callable, **knobs):
        args = [self.tensors[n] for n in self.positional]
        kwargs = {n: t for n, t in self.tensors.items() if n not in self.positional}
        return fn(*args, **kwargs, **self.options, **knobs)

    def map(self, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> Inputs:
        """A copy with every tensor replaced by ``fn(name, tensor)``."""
        return Inputs({n: fn(n, t) for n, t in self.tensors.items()}, self.positional, dict(self.options))

    def to_float64(self) -> Inputs:
        """The same values in float64 (integer tensors such as cu_seqlens unchanged): the truth's input."""
        return self.map(lambda _, t: t.to(torch.float64) if t.is_floating_point() else t)


def _packed_spans(case: Case) -> list[tuple[int, int]]:
    queries = case.seqlens or ()
    return list(zip(queries, case.seqlens_k or queries))


def _rows_without_keys(case: Case, causal: bool) -> bool:
    """Some query row sees no key (causal is bottom-right aligned: a span with more queries than
    keys; any span with queries but no keys)."""
    d = case.dim
    spans = _packed_spans(case) if case.seqlens is not None else [(d["T"], d["S"])]
    return any(q > 0 and (k == 0 or (causal and q > k)) for q, k in spans)


class Requirement(NamedTuple):
    """One entry of ``REQUIREMENTS``: the trait it concerns (None for every op), its check
    ``(card, case, wanted value) -> bool``, what it means, and the extension a case meeting it (wanted
    True) uses, if any: a kernel that declines that extension cannot be asked for such cases."""

    trait: str | None
    check: Callable[..., bool]
    meaning: str
    extension: str | None = None


REQUIREMENTS: dict[str, Requirement] = {
    "min_len": Requirement(None, lambda c, case, n: case.dim["T"] >= n, "at least this many tokens (T; packed: the total)"),
    "min_batch": Requirement(None, lambda c, case, n: case.seqlens is None and case.dim["B"] >= n,
                             "at least this many batch rows (not packed)"),
    "dtype": Requirement(None, lambda c, case, want: case.dtype == want, "this input dtype only"),
    "varlen": Requirement("varlen", lambda c, case, want: want is None or (case.seqlens is not None) == want,
                          "True packed (B == 1 with cu_seqlens), False not packed, None either"),
    "min_seqs": Requirement("varlen", lambda c, case, n: case.seqlens is None or len(case.seqlens) >= n,
                            "packed cases have at least this many sequences"),
    "causal": Requirement("causal", lambda c, case, want: c.causal(case) == want, "a causal case (or not)"),
    "gate_dtype": Requirement("decay_gate", lambda c, case, want: case.drawn.get("gate_dtype", case.dtype) == want,
                              "gates of this dtype"),
    "min_keys": Requirement("keys", lambda c, case, n: max(case.seqlens_k or (case.dim["S"],), default=0) >= n,
                            "some sequence has at least this many keys"),
    "rows_without_keys": Requirement("keys", lambda c, case, want: not want or _rows_without_keys(case, c.causal(case)),
                                     "some query row sees no key (causal with S < T, or an empty key span)"),
    "window": Requirement("keys", lambda c, case, want: want is None or (case.opts.get("window_size") is not None) == want,
                          "a sliding window (window_size) or not", "window"),
    "sinks": Requirement("keys", lambda c, case, want: want is None or bool(case.drawn.get("sinks")) == want,
                         "attention sinks (a per-head logit in every row's softmax) or not", "sinks"),
    "grouped": Requirement("grouped_heads", lambda c, case, want: want is None or (c.grouping.groups(case) > 1) == want,
                           "grouped heads (more than one head per group: GQA, grouped value heads) or not"),
}
"""Requirement name -> (the trait it concerns, or None for every op; its check; what it means)."""


def _keywords(fn: Callable) -> frozenset[str] | None:
    """The keyword names ``fn`` takes, or None when it takes any (``**kwargs``, or no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _after_cut(case: Case, cut: int) -> dict[str, torch.Tensor]:
    """Default of ``OpCard.after``: the query positions after ``cut``."""
    return {"q": torch.arange(case.dim["T"]) > cut}


TRAITS: dict[str, Callable[[OpCard], list[str]]] = {
    "varlen": lambda c: [] if c.empty_outputs else ["empty_outputs (what a sequence without tokens returns)"],
    "state": lambda c: [f"{what}" for what, ok in (
        ("output 'final_state'", "final_state" in c.outputs),
        ("differentiable input 'initial_state'", "initial_state" in c.differentiable)) if not ok],
    "causal": lambda c: [] if c.causal else ["causal (whether a case is causal)"],
    "decay_gate": lambda c: [] if "g" in c.differentiable else ["differentiable input 'g'"],
    "keys": lambda c: [what for what, ok in (
        ("token_axes with a key axis 'k'", c.token_axes and "k" in c.token_axes.values()),
        ("unseen (the keys a query row does not see)", c.unseen is not None)) if not ok],
    "gate_function": lambda c: [] if "gate" in c.outputs else ["output 'gate'"],
    "grouped_heads": lambda c: [] if c.grouping else ["grouping (which heads are shared by a group)"],
    "paged": lambda c: [] if c.paging else ["paging (which inputs are the page pools, the block table, the lengths)"],
    "state_pool": lambda c: [] if any(e.name == "state_pool" for e in c.extensions) else [
        "extension 'state_pool' (ssm_state_indices, inplace_final_state: decode over a pool of states)"],
}
"""Trait -> what a card claiming it lacks (empty: complete). See the module docstring."""


Template = tuple[str, dict[str, int], dict[str, Any]]
"""One grid template: (label, dims, keyword arguments of ``Case.make`` other than dtype and seed)."""

Templates = tuple[list[Template], list[Template]]
"""Grid templates: (base, sweep), lists of (label, dims, keyword arguments of ``Case.make`` other
than dtype and seed). Sizes are small (the CPU runs Triton interpreted) but cover what kernels get
wrong: several batch rows and heads, a partial chunk, a sequence across a chunk boundary, an empty
packed sequence. The sweep is one sequence per length."""

SWEEP_T = (32, 128, 256)
QUICK_SWEEP_T = (16, 64)
"""Sequence lengths of the grid's error-growth sweep (full and ``quick`` grid): within a chunk, across
two, across four with the state carried through the middle ones, an 8x span to see how an error grows
with T. Interpreted Triton costs ~0.5 s per program and chunk of 64 with the backward (a token-parallel
kernel, flash-linear-attention's kda intra, a program per token), so the CPU budget stops at 256."""


def sweep_lengths(quick: bool) -> tuple[int, ...]:
    return QUICK_SWEEP_T if quick else SWEEP_T




@dataclass(frozen=True)
class Grouping:
    """Grouped heads (trait ``grouped_heads``): ``many`` heads (a dim name) in groups of G = many / few, each
    group reading one head of ``inputs``, which have ``few`` heads on dim 2 (head j of the many reads head
    j // G). gated_delta_rule: q, k with H heads read by HV value heads; attention: k, v with Hk heads read by
    H query heads. A case without the ``many`` dim has one head per group. ``extension``: the op's
    extension that offers grouping, if a kernel may decline it."""

    inputs: tuple[str, ...]
    few: str
    many: str
    extension: str | None = None

    def groups(self, case: Case) -> int:
        d = case.dim
        return d.get(self.many, d[self.few]) // d[self.few]


@dataclass(frozen=True)
class Extension:
    """A part of an op's contract that a kernel may leave out: options that a model uses and the
    textbook form of the op does not have (the gate computed in the kernel, grouped value heads, a
    sliding window). A kernel *declines* an extension when its signature takes none of the
    extension's keywords, or when its record says so (``Implementation.declines``: for an extension
    without keywords, such as a shape); cases that use a declined extension are then neither drawn
    nor run for it, and its other verdicts stand. Taking some of an extension's keywords and not the
    others is a contract error (``registry.contract_problems``).

    name:     what the report, ``refcheck contract`` and ``declines`` call it
    keywords: the contract's keyword arguments that belong to it; a case that does not use the
              extension gives them their default values (or leaves them out), and a kernel that
              declines it is called without them
    uses:     ``case -> bool``: the case needs the extension (default: one of its keywords is set
              in the case's options, or is one of its tensors)
    meaning:  one line for the contract
    """

    name: str
    keywords: tuple[str, ...]
    meaning: str
    uses: Callable[[Case], bool] | None = None

    def used_by(self, case: Case) -> bool:
        if self.uses is not None:
            return self.uses(case)
        return any(case.opts.get(k) not in (None, False) for k in self.keywords)


class Paging(NamedTuple):
    """Trait ``paged``: a cache in pages of a pool (serving's paged KV cache). ``caches``: the pools
    ``[P, page, ...]``; ``table``: the block table ``[N, max_pages]`` (sequence n's j-th page); ``lengths``:
    the tokens each sequence has ``[N]``; ``used_rows``: ``(case, inputs) -> [P, page] bool``, the rows some
    sequence's tokens occupy."""

    caches: tuple[str, ...]
    table: str
    lengths: str
    used_rows: Callable


@dataclass(frozen=True)
class OpCard:
    """The record of one op.

    reference:      the float64 truth, written from the math (``references/``); its signature is the
                    op's contract: required parameters by position, the others by keyword
    chunked_reference: the same math in chunks (faster float64 truth; the naive chunked form), as
                    kernels compute it (linear ops: chunk scans; attention: the flash form)
    chunk_options:  keywords the naive and Monte Carlo evaluations give ``chunked_reference`` (the
                    linear ops' in-chunk decays formed as kernels form them)
    outputs:        names of the returned values, in order (a single return value is one name)
    differentiable: tensor inputs that get a gradient when present
    dtypes:         input dtypes of the op
    make_inputs:    ``(case, device) -> Inputs``, deterministic in the case's seed
    cases:          ``(impl, limits, *, pinned, **requirements) -> strategy of Case``: how Hypothesis
                    draws the op's cases (``refcheck.strategies`` has the building blocks)
    traits:         what the op is (``TRAITS``); laws choose ops by trait
    grid:           ``quick -> Templates``: the cases of ``refcheck report`` and ``drift``
    boundary:       ``(T, dtype, packed, batch) -> dims, Case.make keywords`` of a small fixed case
                    at a chunk boundary, or None (no sequence axis worth it)
    token_axes:     input name -> the token axis it runs along (dim 1): "q" (queries / tokens) or
                    "k" (attention's keys); inputs not named have none (states, parameters, cu_seqlens)
    join_dims:      output name -> dim along which pieces of a cut case are joined (tokens; the final
                    state: sequences, 0)
    shared_inputs:  inputs shared by every batch row and sequence (parameters): never sliced
    causal:         ``case -> bool`` (trait ``causal``)
    after:          ``(case, cut) -> {axis: bool mask}``: positions no output at or before ``cut`` may
                    depend on (default: queries after the cut)
    unseen:         ``(case, row) -> [S] bool``: the keys query position ``row`` does not see (trait
                    ``keys``: its window, the causal diagonal, other packed sequences)
    empty_outputs:  ``(case, inputs, length, sequence, provides) -> outputs`` of a packed sequence
                    without tokens (trait ``varlen``)
    implementations: ours and the peers' (the naive forms are added for every card by the registry)
    extensions:     the parts of the contract a kernel may leave out (``Extension``)
    grouping:       which heads a group shares (trait ``grouped_heads``)
    paging:         which inputs hold a paged cache (trait ``paged``)
    """

    name: str
    reference: Callable
    chunked_reference: Callable | None
    outputs: tuple[str, ...]
    differentiable: tuple[str, ...]
    dtypes: tuple[str, ...]
    make_inputs: Callable[[Case, torch.device], Inputs]
    cases: Callable
    traits: frozenset[str] = frozenset()
    grid: Callable[[bool], Templates] | None = None
    boundary: Callable | None = None
    token_axes: Mapping[str, str] = field(default_factory=dict)
    join_dims: Mapping[str, int] = field(default_factory=dict)
    shared_inputs: tuple[str, ...] = ()
    causal: Callable[[Case], bool] | None = None
    after: Callable[[Case, int], dict[str, torch.Tensor]] = _after_cut
    unseen: Callable[[Case, int], torch.Tensor] | None = None
    empty_outputs: Callable | None = None
    implementations: tuple[Implementation, ...] = ()
    chunk_options: Mapping[str, object] = field(default_factory=dict)
    extensions: tuple[Extension, ...] = ()
    grouping: Grouping | None = None
    paging: Paging | None = None

    def __post_init__(self):
        unknown = set(self.traits) - set(TRAITS)
        if unknown:
            raise ValueError(f"op {self.name}: unknown traits {sorted(unknown)}; known: {', '.join(TRAITS)}")
        for impl in self.implementations:
            if impl.op != self.name:
                raise ValueError(f"op {self.name}: lists an implementation of {impl.op!r} ({impl.name})")
        contract = inspect.signature(self.reference).parameters
        for ext in self.extensions:
            bad = [k for k in ext.keywords if k not in contract or contract[k].default is inspect.Parameter.empty]
            if bad:
                raise ValueError(f"op {self.name}: extension {ext.name!r} names {', '.join(bad)}, which the "
                                 "reference does not take as keyword arguments with a default")

    # --- extensions: what a kernel may leave out ---------------------------------------------------

    def extension(self, name: str) -> Extension:
        for ext in self.extensions:
            if ext.name == name:
                return ext
        known = ", ".join(e.name for e in self.extensions) or "none"
        raise ValueError(f"op {self.name} has no extension {name!r} (its extensions: {known})")

    def declined(self, impl: Implementation | None) -> frozenset[str]:
        """The extensions ``impl`` declines: those its record names (``Implementation.declines``) and
        those whose keywords its signature takes none of (``**kwargs`` takes every one)."""
        if impl is None:
            return frozenset()
        named = set(impl.declines)
        for name in named:
            self.extension(name)   # a typo in a record is an error, not an extension silently kept
        try:
            takes = _keywords(impl.fn)
        except Exception:      # a peer that does not import here: nothing runs, nothing is declined
            takes = None
        return frozenset(named | {e.name for e in self.extensions
                                  if e.keywords and takes is not None and not takes & set(e.keywords)})

    def declined_by_callee(self, fn: Callable) -> tuple[str, ...]:
        """The extension keywords ``fn``'s signature does not take (what a call must leave out)."""
        takes = _keywords(fn)
        if takes is None:
            return ()
        return tuple(k for e in self.extensions for k in e.keywords if k not in takes)

    def uses_declined(self, case: Case, declined: frozenset[str]) -> list[str]:
        """The declined extensions ``case`` needs."""
        return [e.name for e in self.extensions if e.name in declined and e.used_by(case)]

    def fit_call(self, fn: Callable, inputs: Inputs) -> Inputs:
        """``inputs`` as ``fn`` is called with them: without the keywords of extensions it does not take
        (the case does not use them: their defaults; ValueError if it does, which drawing never does)."""
        drop = self.declined_by_callee(fn)
        if not drop:
            return inputs
        used = [k for k in drop if k in inputs.tensors or inputs.options.get(k) not in (None, False)]
        if used:
            raise ValueError(f"{self.name}: the case sets {', '.join(used)}, which the implementation does not take")
        return Inputs({n: t for n, t in inputs.tensors.items() if n not in drop}, inputs.positional,
                      {n: v for n, v in inputs.options.items() if n not in drop})

    def problems(self) -> list[str]:
        """What this card lacks for the traits it claims (empty when complete)."""
        return [f"op {self.name} claims trait {trait!r} but has no {what}"
                for trait in sorted(self.traits) for what in TRAITS[trait](self)]

    @staticmethod
    def grad_name(input_name: str) -> str:
        return GRAD_NAMES.get(input_name, "d" + input_name)

    @property
    def budget_outputs(self) -> tuple[str, ...]:
        """Every name a budget can be given for: outputs, then gradients."""
        return self.outputs + tuple(self.grad_name(n) for n in self.differentiable)

    def form(self, name: str) -> Callable:
        """The reference in form ``name``: ``"recurrent"`` (as written) or ``"chunked"`` (the chunk form with
        ``chunk_options``, as kernels compute it), evaluated in the dtype of its inputs."""
        if name == "recurrent":
            return self.reference
        chunked = self.chunked_reference
        if name != "chunked" or chunked is None:
            raise ValueError(f"op {self.name} has no {name!r} form")
        options = dict(self.chunk_options)

        def in_chunks(*args, **kwargs):
            return chunked(*args, **options, **kwargs)
        return in_chunks

    def split(self, result, inputs: Inputs | None = None) -> dict[str, torch.Tensor]:
        """Name the values an implementation returned; a ``None`` output is left out. Each one must be a
        plain dense ``torch.Tensor`` (no subclass: a lazy tensor that computes only when compared is
        none) and, given the ``inputs`` of the call, on their device and sharing storage with none of
        them nor with another output (a copy of an input returned as is, a result cached in a buffer
        the caller holds): ``ReturnError`` otherwise, before anything reads the values."""
        values = result if isinstance(result, tuple) else (result,)
        if len(values) != len(self.outputs):
            raise ReturnError(f"{self.name}: expected {len(self.outputs)} return values "
                              f"{self.outputs}, got {len(values)}")
        named = {n: v for n, v in zip(self.outputs, values) if v is not None}
        for name, value in named.items():
            if type(value) is not torch.Tensor:
                raise ReturnError(f"{name}: a {type(value).__module__}.{type(value).__qualname__}, where the "
                                  "contract returns a plain torch.Tensor")
            if value.layout is not torch.strided:
                raise ReturnError(f"{name}: layout {value.layout}, where the contract returns a dense tensor")
        if inputs is None:
            return named
        device = inputs.tensors[inputs.positional[0]].device
        given = {n: t for n, t in inputs.tensors.items() if isinstance(t, torch.Tensor)}
        seen: dict[int, str] = {}
        for name, t in given.items():
            if t.numel():
                seen.setdefault(t.untyped_storage().data_ptr(), f"input {name}")
        for name, value in named.items():
            if value.device != device:
                raise ReturnError(f"{name}: on {value.device}, where the inputs are on {device}")
            if not value.numel():
                continue
            ptr = value.untyped_storage().data_ptr()
            if ptr in seen:
                raise ReturnError(f"{name}: shares its storage with {seen[ptr]} (the contract returns new tensors)")
            seen[ptr] = f"output {name}"
        return named

    # --- requirements: one vocabulary to draw and to check ---------------------------------------

    def understands(self, requirement: str) -> bool:
        """Whether the requirement concerns this op (its trait is one of the op's, or it has none)."""
        if requirement not in REQUIREMENTS:
            raise ValueError(f"unknown requirement {requirement!r}; known: {', '.join(REQUIREMENTS)}")
        trait = REQUIREMENTS[requirement].trait
        return trait is None or trait in self.traits

    def meets(self, case: Case, require: Mapping) -> bool:
        """Whether a fixed ``case`` meets ``require`` (a requirement that does not concern the op,
        ``understands``, is met: the op has no such thing to vary)."""
        return all(REQUIREMENTS[key].check(self, case, want) for key, want in require.items() if self.understands(key))

    def relevant(self, require: Mapping) -> dict:
        """The requirements of ``require`` that concern this op (what its ``cases`` is given)."""
        return {k: v for k, v in require.items() if self.understands(k)}

    # --- cutting a case into pieces (laws 2-4) ----------------------------------------------------

    def piece(self, x: Inputs, q: tuple[int, int], k: tuple[int, int] | None = None,
              seq: int | None = None, cu: torch.Tensor | None = None) -> Inputs:
        """Tokens ``q`` (and keys ``k``) of ``x``, the initial state of sequence ``seq``, no
        cu_seqlens (or ``cu`` in their place)."""
        tensors = {}
        for name, t in x.tensors.items():
            axis = self.token_axes.get(name)
            if axis == "q":
                t = t[:, q[0]:q[1]]
            elif axis == "k":
                assert k is not None    # an op with a key axis is always cut with keys
                t = t[:, k[0]:k[1]]
            elif name == "initial_state" and seq is not None:
                t = t[seq:seq + 1]
            elif name.startswith("cu_seqlens"):
                if cu is None:
                    continue
                t = cu
            tensors[name] = t
        return Inputs(tensors, x.positional, dict(x.options))

    def row(self, x: Inputs, b: int) -> Inputs:
        """Batch row ``b`` of ``x`` (shared inputs whole)."""
        return x.map(lambda n, t: t if n in self.shared_inputs else t[b:b + 1])

    def spans(self, case: Case) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """(query span, key span) of each packed sequence (key span = query span without keys)."""
        def bounds(lens):
            edges = list(itertools.accumulate(lens, initial=0))
            return list(zip(edges[:-1], edges[1:]))
        q = bounds(case.seqlens)
        return list(zip(q, bounds(case.seqlens_k) if case.seqlens_k is not None else q))
