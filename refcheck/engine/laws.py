"""The laws every implementation of an op must obey, as plain functions.

A law takes an implementation and one drawn example (a ``Case``, a precision mode, the
implementation's knobs and the law's own parameters) and raises ``LawViolation`` when the
implementation breaks it. pytest (``properties/``), ``refcheck fuzz`` and ``refcheck report`` run the
same functions: ``check`` runs one example, ``hypothesis_check`` searches for a counterexample,
``reproduce`` is what a failure message tells you to run.

Errors are measured one way only: against the float64 truth through ``refcheck.engine.verify``, or between
two evaluations of the same math with ``verify.measure`` (the two may differ by no more than the
implementation may differ from the truth: the budgets of ``tolerances.toml``), and bit for bit with
``refcheck.model.metrics``. Laws exact in real arithmetic but not in floating point (batch invariance,
varlen == separate runs, state chaining, causality, path agreement, ...) give two verdicts: within
budget (a failure raises) and bitwise (reported in ``Outcome.notes``; ``strict`` -- the environment
variable ``REFCHECK_STRICT_BITWISE=1`` or pytest's ``--strict-bitwise`` -- makes it a failure too).

``LAWS`` lists them by name; numbers refer to issue 4.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from hypothesis import assume, currently_in_test_context, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ..model import budgets as budgets_mod
from ..model import registry
from ..model.case import PRECISION_MODES, Case
from ..model.metrics import bitwise_equal, max_abs_diff, rel_rms
from ..model.ops import OPS, REQUIREMENTS, Inputs, ReturnError, card
from ..runtime import workers
from ..strategies import INTERPRETED, SMALL, Limits
from . import verify
from .examples import Example, boundary_cases, examples
from .oneliner import one_liner

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

STRICT_ENV = "REFCHECK_STRICT_BITWISE"


class LawViolation(AssertionError):
    """An implementation broke a law on one example. The message names the law, op, implementation,
    mode, knobs, case (shapes, dtypes, seed), what went wrong and a one-line reproducer.
    ``signature`` says which failure it is (``Verdict.signature``: outputs or gradients, and the dtype,
    ``"gradients fp32"``; empty where the law fails one way only): ``violation`` gives each signature its
    own subclass."""

    signature = ""


@functools.cache
def violation(signature: str) -> type[LawViolation]:
    """The ``LawViolation`` of a failure signature, a subclass of its own. Hypothesis tells distinct bugs
    apart by the type and place of what they raise, and shrinks each to its own minimal example: one
    failure (a rounding alarm on a one-key fp32 case) must not take the place of another (a causal mask
    that lets bf16 rows see later keys) while shrinking."""
    if not signature:
        return LawViolation
    return type(f"LawViolation[{signature}]", (LawViolation,), {"signature": signature, "__module__": __name__})


def combined(group: BaseException, law_name: str) -> LawViolation:
    """One ``LawViolation`` of the distinct failures Hypothesis reports together (an exception group):
    each with its own minimal example and reproducer, in the order found."""
    found = distinct_failures(group)
    if len(found) == 1 and isinstance(found[0], LawViolation):
        return found[0]
    parts = [f"law {law_name}: {len(found)} distinct failures, each shrunk to its own minimal example:"]
    for i, err in enumerate(found, 1):
        text = str(err) if isinstance(err, LawViolation) else f"{type(err).__name__}: {err}"
        parts.append(f"[{i}/{len(found)}] {text}")
    return LawViolation("\n\n".join(parts))


def distinct_failures(error: BaseException) -> list[BaseException]:
    """The failures Hypothesis raised: those of a (nested) exception group, or the exception itself."""
    inner = getattr(error, "exceptions", None)
    if inner is None:
        return [error]
    return [leaf for e in inner for leaf in distinct_failures(e)]


class BitwiseDifference(UserWarning):
    """A law exact in real arithmetic held within budget but not bit for bit (reported, not failed
    unless strict)."""


@dataclass
class Outcome:
    """What a law found on an example where it held: bitwise differences, one line each."""

    law: str
    notes: list[str] = field(default_factory=list)


def strict_default() -> bool:
    """Strict bitwise mode from the environment (``REFCHECK_STRICT_BITWISE=1``)."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0", "false", "no")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal up to the sign of zero and NaN payloads (same dtype, shape and values)."""
    return bitwise_equal(a, b) or (a.dtype == b.dtype and a.shape == b.shape and max_abs_diff(a, b) == 0.0)


# --- one example of one law ----------------------------------------------------------------------

@dataclass
class Trial:
    """A law evaluated on one example: runs the implementation, measures, and fails with a message
    that says everything needed to reproduce."""

    law: Law
    impl: registry.Implementation
    case: Case
    mode: str
    knobs: dict
    params: dict
    device: str = "cpu"
    strict: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def op(self):
        return card(self.case.op)

    @property
    def grads(self) -> bool:
        return self.impl.backward and self.impl.refused_backward(self.device, self.case) is None

    def knob_args(self, knobs: dict | None = None) -> dict:
        """The keyword knobs passed to the implementation (``precision`` = the mode where it has one)."""
        knobs = dict(self.knobs if knobs is None else knobs)
        return {"precision": self.mode, **knobs} if "precision" in self.impl.knobs else knobs

    def inputs(self, case: Case | None = None) -> Inputs:
        return self.op.make_inputs(case or self.case, torch.device(self.device))

    def cotangents(self, outputs: dict) -> dict:
        return verify.upstream_gradients(self.op, self.case, outputs)

    # running the implementation: an exception it raises on valid input is a violation
    @contextmanager
    def running(self, what: str = "the implementation"):
        try:
            yield
        except LawViolation:
            raise
        except ReturnError as err:
            self.fail(f"{what} returned what the contract does not: {err}")
        except Exception as err:
            tb = "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-6))
            self.fail(f"{what} raised {type(err).__name__} on valid input: {err}\n{tb}")

    def call(self, inputs: Inputs, knobs: dict | None = None, **options) -> dict[str, torch.Tensor]:
        """One call of the implementation (inside a graph being built); returns the named outputs.
        ``options`` override the case's options (e.g. ``output_final_state=True``)."""
        inputs = Inputs(inputs.tensors, inputs.positional, {**inputs.options, **options})
        with self.running():
            called = self.op.fit_call(self.impl.fn, inputs)
            return self.op.split(called.call(self.impl.fn, **self.knob_args(knobs)), called)

    def evaluate(self, inputs: Inputs, cotangents=None, knobs: dict | None = None) -> dict[str, torch.Tensor]:
        """Outputs and (with a backward) gradients of one call, against ``cotangents`` (a dict, or a
        function of the outputs; default the case's seeded ones)."""
        with self.running():
            return verify.evaluate(self.impl.fn, self.op, inputs, grads=self.grads,
                                   cotangents=self.cotangents if cotangents is None else cotangents,
                                   **self.knob_args(knobs))

    def composite(self, inputs: Inputs, forward: Callable[[Inputs], dict], cotangents=None, *,
                  fresh_leaves: bool = True) -> dict[str, torch.Tensor]:
        """Outputs and gradients of ``forward(inputs)``, a computation made of several calls (the
        pieces of a packed batch, two halves of a sequence): autograd carries the gradients of the
        pieces back to the whole inputs, so they compare with one call's gradients directly.
        ``cotangents``: a dict, or a function of the outputs (default the case's seeded ones).
        ``fresh_leaves=False`` makes the given tensors themselves the leaves (to see in-place writes)."""
        leaves: dict[str, torch.Tensor] = {}
        if self.grads:
            if fresh_leaves:
                inputs, leaves = verify.leaf_inputs(self.op, inputs)
            else:
                leaves = {n: t.requires_grad_(True) for n, t in inputs.tensors.items()
                          if n in self.op.differentiable and t.is_floating_point()}
        with torch.set_grad_enabled(self.grads):
            result = {n: t for n, t in forward(inputs).items() if t is not None}
        if not self.grads:
            return {n: t.detach() for n, t in result.items()}
        if cotangents is None or callable(cotangents):
            cotangents = (cotangents or self.cotangents)(result)
        with self.running("the implementation's backward"):
            out = verify.backprop(self.op, result, cotangents, leaves)
        for name, leaf in leaves.items():            # a leaf no piece read (all pieces empty): zero gradient
            out.setdefault(self.op.grad_name(name), torch.zeros_like(leaf.detach()))
        return out

    # verdicts
    def compare(self, what: str, out: dict, ref: dict, *, bitwise: bool = True, sums: bool = False,
                summed: tuple[str, ...] = ()) -> None:
        """Within budget (fails) and, if ``bitwise``, bit for bit (noted; fails when strict): ``out``
        against ``ref``, two evaluations of the same math. ``sums``: ``ref`` is a composite
        whose parameter gradients (dA_log, ddt_bias) autograd summed over the pieces, an order no
        single run shares: those are held to the budget only, as are the gradients named in ``summed``."""
        verdict = verify.measure(self.impl, self.case, out, ref, mode=self.mode,
                                 grads=self.grads, knobs=self.knob_args())
        if not verdict.passed:
            self.fail(f"{what}: the two evaluations differ by more than the budget\n{verdict.table()}",
                      verdict.signature)
        if not bitwise:
            return
        skip = ({self.op.grad_name(p) for p in self.op.shared_inputs} if sums else set()) | set(summed)
        differ = {n: max_abs_diff(out[n], ref[n]) for n in ref
                  if n in out and n not in skip and not same_bits(out[n], ref[n])}
        if differ:
            worst = ", ".join(f"{n} {d:.2e}" for n, d in differ.items())
            line = f"{self.law.name} {self.case.op}/{self.impl.name}: {what}: within budget, not bitwise (max abs diff {worst})"
            if self.strict:
                self.fail(f"{what}: not bitwise identical (strict mode): max abs diff {worst}")
            self.notes.append(line)

    def fail(self, what: str, signature: str = ""):
        """Raise the violation: ``what`` went wrong; ``signature`` tells this failure from others (``violation``)."""
        raise violation(signature)(self.message(what))

    def vacuous(self, why: str) -> None:
        """This example cannot show what the law is about (``why``). In a Hypothesis search it is
        rejected and another one drawn (a run whose every example is vacuous ends in Hypothesis'
        ``Unsatisfiable``, never green); elsewhere (a reproducer, a fixed example) the law holds
        there vacuously, and a note says so."""
        if currently_in_test_context():
            assume(False)
        self.notes.append(f"{self.law.name} {self.case.op}/{self.impl.name}: no verdict on {self.case.describe()}: {why}")

    def message(self, what: str) -> str:
        knobs = ", ".join(f"{k}={v!r}" for k, v in (*self.knobs.items(), *self.params.items()))
        try:
            shapes = ", ".join(f"{n}{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                               for n, t in self.inputs().tensors.items())
        except Exception as err:  # the message must not hide the violation
            shapes = f"(cannot rebuild inputs: {str(err).splitlines()[0] if str(err) else type(err).__name__})"
        return "\n".join([
            f"law {self.law.name} ({self.law.number}) violated: {self.case.op} [{self.impl.name}] mode={self.mode}"
            + (f" {knobs}" if knobs else ""),
            f"  case: {self.case.describe()}",
            f"  inputs: {shapes}",
            *("  " + line for line in what.splitlines()),
            f"  reproduce: {self.reproducer()}"])

    def reproducer(self) -> str:
        """A one-liner rerunning this example (``refcheck.engine.reproduce.law``), for a user's kernel too."""
        args = [self.case.to_python(), f"mode={self.mode!r}"]
        if self.knobs:
            args.append(f"knobs={self.knobs!r}")
        if self.params:
            args.append(f"params={self.params!r}")
        if self.device != "cpu":
            args.append(f"device={self.device!r}")
        if self.strict:
            args.append("strict=True")
        return one_liner("law", self.impl, args, leading=[repr(self.law.name)])


def _join(parts: list[dict], dims) -> dict:
    """Concatenate the pieces' outputs, each along its dim in ``dims`` (default 0)."""
    names = [n for n in parts[0] if parts[0][n] is not None] if parts else []
    return {n: torch.cat([p[n] for p in parts], dims.get(n, 0)) for n in names}


# --- the laws ------------------------------------------------------------------------------------

def agreement(t: Trial) -> None:
    """Law 1: outputs, final states and every gradient the implementation provides agree with the
    float64 reference within the budgets of ``tolerances.toml`` (random upstream gradients)."""
    ref = verify.truth(t.case, t.grads, verify.cotangent_names(t.op, registry.provides(t.impl)))
    out = t.evaluate(t.inputs())
    verdict = verify.measure(t.impl, t.case, out, ref, mode=t.mode, grads=t.grads,
                             knobs=t.knob_args())
    if not verdict.passed:
        t.fail("not within budget of the float64 truth\n" + verdict.table(), verdict.signature)


def causality(t: Trial, *, cut: int) -> None:
    """Law 2 (and 11: a causal query row never depends on later keys): changing every input at
    positions ``> cut`` (for attention: later queries and every key no row ``<= cut`` sees) leaves
    the outputs at positions ``<= cut`` unchanged, and, with upstream gradients zero after ``cut``,
    every gradient unchanged. Inputs are replaced by those of another seed (valid draws)."""
    case = t.case
    base_in = t.inputs()
    changed = _changed(t, base_in, t.op.after(case, cut))

    def masked(outputs):
        cts = t.cotangents(outputs)
        cts.pop("final_state", None)
        for name, dim in t.op.join_dims.items():
            if name in cts:
                cts[name] = cts[name].clone()
                cts[name].narrow(dim, cut + 1, cts[name].shape[dim] - cut - 1).zero_()
        return cts

    before = t.evaluate(base_in, masked)
    after = t.evaluate(changed, masked)

    def kept(res):
        res = {n: x for n, x in res.items() if n != "final_state"}
        for name, dim in t.op.join_dims.items():
            if name in res:
                res[name] = res[name].narrow(dim, 0, cut + 1)
        return res
    t.compare(f"outputs at positions <= {cut} after changing later inputs", kept(after), kept(before))


def _changed(t: Trial, x: Inputs, positions: Mapping[str, torch.Tensor]) -> Inputs:
    """``x`` with every input along a token axis of ``positions`` (axis -> bool mask over it) replaced there by
    the inputs of another seed (valid draws): what causality and window locality change."""
    alt = t.inputs(t.case.replace(seed=t.case.seed ^ 0x5EED))
    masks = {axis: mask.to(t.device) for axis, mask in positions.items()}

    def mix(name, v):
        axis = t.op.token_axes.get(name)
        if axis not in masks:
            return v
        v = v.clone()
        v[:, masks[axis]] = alt.tensors[name][:, masks[axis]]
        return v
    return x.map(mix)


def varlen_equals_separate(t: Trial) -> None:
    """Law 3: packing sequences with cu_seqlens gives each sequence (outputs, final state and
    gradients) what it gets when run alone. An empty sequence, never run alone, gets what the
    contract says: no output rows, its initial state (or zeros) as final state; an attention query
    span without keys gets o = 0 and lse = -inf."""
    case, op = t.case, t.op
    inputs = t.inputs()
    packed = t.evaluate(inputs)

    def separate(x: Inputs) -> dict:
        parts = []
        for n, (q, k) in enumerate(op.spans(case)):
            if q[1] > q[0] and k[1] > k[0]:
                parts.append(t.call(op.piece(x, q, k, n)))
            else:
                parts.append(op.empty_outputs(case, x, q[1] - q[0], n, registry.provides(t.impl)))
        return _join(parts, op.join_dims)
    alone = t.composite(inputs, separate, t.cotangents(packed))
    t.compare("packed sequences against each sequence run alone", packed, alone, sums=True)


def batch_invariance(t: Trial) -> None:
    """Law 3: each row of a batch gets (outputs, final state, gradients) what it gets run alone."""
    inputs = t.inputs()
    batched = t.evaluate(inputs)

    def rows(x: Inputs) -> dict:
        return _join([t.call(t.op.row(x, b)) for b in range(t.case.dim["B"])], {})
    alone = t.composite(inputs, rows, t.cotangents(batched))
    t.compare("batch rows against each row run alone", batched, alone, sums=True)


def state_chaining(t: Trial, *, split: int) -> None:
    """Law 4: running tokens [0, split) with output_final_state, then [split, T) from the carried
    final state, equals one run over [0, T): outputs, final state and gradients (the gradient flows
    back through the carried state). Packed sequences are cut at the same position: cu_seqlens
    clipped to each part, sequences that end before (start after) the cut pass their state through
    an empty span."""
    case, op = t.case, t.op
    inputs = t.inputs()
    whole = t.evaluate(inputs)
    total = case.dim["T"]
    cu = inputs.tensors.get("cu_seqlens")

    def chained(x: Inputs) -> dict:
        first = op.piece(x, (0, split), cu=None if cu is None else cu.clamp(max=split))
        a = t.call(first, output_final_state=True)
        if "final_state" not in a:
            t.fail("returned no final state with output_final_state=True")
        second = op.piece(x, (split, total), cu=None if cu is None else cu.clamp(min=split) - split)
        second.tensors["initial_state"] = a["final_state"]
        b = t.call(second)
        return {"o": torch.cat([a["o"], b["o"]], 1), "final_state": b.get("final_state")}
    parts = t.composite(inputs, chained, t.cotangents(whole))
    t.compare(f"one run against two runs split at {split} with the state carried", whole, parts, sums=True)


def determinism(t: Trial) -> None:
    """Law 5: two runs on the same inputs give bitwise identical outputs and gradients."""
    first, second = t.evaluate(t.inputs()), t.evaluate(t.inputs())
    differ = {n: (max_abs_diff(first[n], second[n]) if n in second else math.inf) for n in first
              if n not in second or not same_bits(first[n], second[n])}
    if differ:
        t.fail("two runs on the same inputs differ: max abs diff "
               + ", ".join(f"{n} {d:.2e}" for n, d in differ.items()))


@contextmanager
def poisoned_allocations():
    """Inside the block ``torch.empty`` and friends return NaN-filled memory (PyTorch's
    ``fill_uninitialized_memory``, active under deterministic algorithms), so an output element an
    implementation never writes shows up as NaN."""
    import torch.utils.deterministic as det
    was, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was, warn_only=was_warn)


def no_side_effects(t: Trial) -> None:
    """Law 6: after the forward and backward call every input (cu_seqlens, initial state and
    parameters included) is bitwise unchanged, and every output and gradient is finite wherever the
    float64 truth is. The contract's implementations take no preallocated output buffers, so instead
    of poisoning given buffers, fresh allocations are poisoned with NaN (``poisoned_allocations``):
    an element never written is NaN and fails the finiteness check."""
    inputs = t.inputs()
    before = {n: x.clone() for n, x in inputs.tensors.items()}
    with poisoned_allocations():
        out = t.composite(inputs, t.call, fresh_leaves=False)
    changed = [n for n, x in inputs.tensors.items() if not bitwise_equal(x.detach(), before[n])]
    if changed:
        t.fail("modified its inputs in place: " + ", ".join(
            f"{n} (max abs change {max_abs_diff(inputs.tensors[n].detach(), before[n]):.2e})" for n in changed))
    ref = verify.truth(t.case, t.grads, verify.cotangent_names(t.op, registry.provides(t.impl)))
    bad = [n for n in ref if n in out and math.isinf(rel_rms(out[n], ref[n], budgets_mod.DEFAULT_FLOOR))]
    if bad:
        counts = _nonfinite(out, ref)
        t.fail("NaN/Inf (or an unwritten, NaN-poisoned element) where the float64 truth is finite: "
               + ", ".join(f"{n} ({counts.get(n, 0)} elements)" for n in bad))


def _nonfinite(out: dict, ref: dict) -> dict[str, int]:
    """For each name in both: how many elements of ``out`` are NaN or Inf where ``ref`` is finite
    (names with none left out)."""
    counts = {n: int((~torch.isfinite(out[n]) & torch.isfinite(ref[n].to(out[n].device))).sum())
              for n in ref if n in out}
    return {n: c for n, c in counts.items() if c}


def path_knobs(impl: registry.Implementation) -> list[dict]:
    """Combinations of the implementation's non-precision knobs, the declared defaults first, in which every
    value of each knob meets every value of every other knob (all pairs: with one or two knobs every
    combination, with three two-valued knobs four of the eight). Greedy over the full product: each next
    combination is the first that meets the most pairs not yet met. Higher-order combinations are left to
    the laws that draw their knobs at random (``strategies.knob_settings``)."""
    names = [n for n in impl.knobs if n != "precision"]
    product = [dict(zip(names, values)) for values in itertools.product(*(impl.knobs[n] for n in names))]
    if len(names) < 3:
        return product

    def pairs(combo: dict) -> set:
        return {(a, repr(combo[a]), b, repr(combo[b])) for a, b in itertools.combinations(names, 2)}
    unmet = set().union(*map(pairs, product)) - pairs(product[0])
    chosen = [product[0]]
    while unmet:
        chosen.append(max(product, key=lambda combo: len(pairs(combo) & unmet)))
        unmet -= pairs(chosen[-1])
    return chosen


def autotuned_kernels(impl: registry.Implementation) -> dict[str, object]:
    """The interpreted ``@triton.autotune`` kernels with more than one config in the package of a
    Triton implementation, by ``module.name`` (empty when not interpreted: configs are pinned through
    the faithful interpreter, ``refcheck.runtime.interpreter.pin_config``)."""
    if not impl.triton or os.environ.get("TRITON_INTERPRET") != "1":
        return {}
    from ..runtime import interpreter
    if not interpreter.is_enabled():
        return {}
    _ = impl.fn  # imports the package
    package = impl.target.partition(":")[0].split(".")[0]
    found, seen = {}, set()
    for module_name, module in sorted(sys.modules.items()):
        if module is None or not (module_name == package or module_name.startswith(package + ".")):
            continue
        for attr, obj in sorted(vars(module).items()):
            if id(obj) in seen:
                continue
            try:
                if len(interpreter.configs(obj)) > 1 and interpreter.is_interpreted(obj):
                    found[f"{module_name}.{attr}"] = obj
                    seen.add(id(obj))
            except (ValueError, TypeError, AttributeError):
                continue
    return found


def path_agreement(t: Trial) -> None:
    """Law 7: the implementation's knob combinations (gather or not, recompute or not, chunk size, ...;
    every pair of knob values, ``path_knobs``) compute what the default combination computes, within
    budget (bitwise reported); and, interpreted, so does every autotune config: run i pins each autotuned kernel
    of the implementation to its config ``i mod (its number of configs)``, so every config of every
    kernel runs in every example."""
    inputs = t.inputs()
    combos = path_knobs(t.impl)
    base = t.evaluate(inputs, knobs=combos[0])
    for knobs in combos[1:]:
        t.compare(f"knobs {knobs} against {combos[0]}", t.evaluate(t.inputs(), knobs=knobs), base)
    kernels = autotuned_kernels(t.impl)
    if not kernels:
        return
    from ..runtime import interpreter
    counts = {name: len(interpreter.configs(k)) for name, k in kernels.items()}
    for i in range(max(counts.values())):
        with ExitStack() as pins:
            for name, kernel in kernels.items():
                pins.enter_context(interpreter.pin_config(kernel, i % counts[name]))
            pinned = t.evaluate(t.inputs(), knobs=combos[0])
        chosen = ", ".join(f"{name}[{i % n}]" for name, n in counts.items())
        t.compare(f"autotune configs {chosen} against the default configs", pinned, base)


PRECISION_SLACK = 4.0
"""error(ieee) <= SLACK * error(tf32x3) + NOISE and error(tf32x3) <= SLACK * error(tf32) + NOISE."""
PRECISION_NOISE = 2e-6
"""Absolute allowance for the order: ~16 fp32 ulps of relative error, below which modes are equal ...
plus ``PRECISION_SLACK`` times what rounding in float32 costs that output on the case, where the
order fails without it: the larger of the op's float32 naive error (``verify.yardstick``) and the
reference's Monte Carlo float32 error (``verify.monte_carlo_error``). An output whose float32
computation is poorly conditioned is noise at that level in every fp32-accurate mode, and two modes
that round differently order their noise at random. On an H200, KDA's dA_log (a sum over every token
with cancellation; fp32, fp16 gate input, T=124) measured ieee 4.11e-5 against tf32x3 6.00e-6 (tf32
3.60e-3), with the float32 reference's own error 1.88e-5 there; our KDA kernel's dg at T = 1 without
a state (truth 0) measured 3.0e-6 under ieee and exactly 0 under tf32x3, the rounding of
``q * dq - k * dk``, which only the Monte Carlo error sees. A mode that runs tf32 where ieee was asked
stays ~100x above that floor (``tests/mutants.py``)."""
TF32_GAIN = 8.0
"""tf32 must be at least this many times worse than ieee and tf32x3 (its operands keep 10 of 23
mantissa bits: ~1000x in practice) ..."""
TF32_MIN_ERROR = 1e-5
"""... and at least this bad (2^-11 operand rounding shows as >= 1e-4 on random data) ..."""
TF32_MIN_EXCESS = 5e-4
"""... or, where the fp32 computation itself is poorly conditioned, worse than both by at least this
much (about one 2^-11 operand rounding). On an H100, simple GLA in fp32 with gates of spikes of -1000
(cumulative log-decays near -1000, whose fp32 differences lose ~1e-4) measured ieee 2.89e-4, tf32x3
2.91e-4, tf32 1.53e-3 on o: tf32 5.3x worse, excess 1.24e-3, where ``TF32_GAIN`` alone failed a kernel
that honours its modes. A kernel that ignores its mode computes the same in every mode: excess 0."""


def precision_modes(t: Trial) -> None:
    """Law 8: on fp32 inputs the precision modes are honoured: per output, error(ieee) <=
    error(tf32x3) <= error(tf32) up to ``PRECISION_SLACK`` and ``PRECISION_NOISE`` (plus, where the order
    fails without it, what rounding in float32 costs that output), and on some
    output tf32 is measurably worse than both ieee and tf32x3 (``TF32_MIN_ERROR``, and ``TF32_GAIN`` or
    ``TF32_MIN_EXCESS``;
    an output dominated by something else, dg stored in bf16, cannot show it): a kernel that ignores
    its mode, or runs tf32 where tf32x3 was asked, fails. An example whose float64 truth has no
    finite nonzero value (attention where no query row sees a key) rounds nothing in any mode: no
    verdict there (``Trial.vacuous``)."""
    truth = verify.truth(t.case, t.grads, verify.cotangent_names(t.op, registry.provides(t.impl)))  # verify's, cached
    if not any(bool((torch.isfinite(x) & (x != 0)).any()) for x in truth.values()):
        t.vacuous("its float64 truth has no finite nonzero value, so no precision mode rounds anything")
        return
    errors: dict[str, dict[str, float]] = {}
    for mode in ("ieee", "tf32x3", "tf32"):
        with t.running():
            verdict = verify.verify(t.impl, t.case, mode=mode, device=t.device, grads=t.grads, **t.knobs)
        errors[mode] = {m.output: m.error for m in verdict.measurements}
    floors = {m.output: m.budget.floor for m in verdict.measurements}

    def fp32_noise(name: str) -> float:  # what rounding in float32 costs this output (evaluations cached)
        outputs = verify.cotangent_names(t.op, registry.provides(t.impl))
        naive = verify.yardstick(t.case, name, floors[name], grads=t.grads, outputs=outputs)[0] or 0.0
        mc = verify.monte_carlo_error(t.case, name, floors[name], "ieee", grads=t.grads, outputs=outputs)[0] or 0.0
        return max(naive, mc)

    def disordered(e: dict, noise: float) -> bool:
        return e["ieee"] > PRECISION_SLACK * e["tf32x3"] + noise or e["tf32x3"] > PRECISION_SLACK * e["tf32"] + noise

    table = "\n".join(f"{n:<12} ieee {errors['ieee'][n]:9.2e}  tf32x3 {errors['tf32x3'][n]:9.2e}  "
                      f"tf32 {errors['tf32'][n]:9.2e}" for n in errors["ieee"])
    for name in errors["ieee"]:
        e = {m: errors[m][name] for m in errors}
        if not disordered(e, PRECISION_NOISE):
            continue
        floor = fp32_noise(name)
        if disordered(e, PRECISION_NOISE + PRECISION_SLACK * floor):
            t.fail(f"{name}: errors not ordered ieee <= tf32x3 <= tf32 (slack {PRECISION_SLACK}x + "
                   f"{PRECISION_NOISE:g} + {PRECISION_SLACK}x what float32 rounding costs it, {floor:.2e})\n{table}")
    def worse(n):
        tf32, best = errors["tf32"][n], max(errors["ieee"][n], errors["tf32x3"][n])
        return tf32 >= TF32_MIN_ERROR and (tf32 >= TF32_GAIN * best or tf32 - best >= TF32_MIN_EXCESS)
    if not any(worse(n) for n in errors["tf32"]):
        t.fail(f"tf32 is not measurably worse than ieee and tf32x3 on any output (needs >= {TF32_MIN_ERROR:g} "
               f"and >= {TF32_GAIN}x or >= {TF32_MIN_EXCESS:g} more): the precision mode is not honoured\n{table}")


def head_first(t: Trial) -> None:
    """Law 13: the head-first layout computes the same bits. Given every input with a token axis
    transposed to ``[B, H, T, ...]`` (contiguous) and ``head_first=True``, an implementation that
    offers it (``Implementation.head_first``) returns, transposed back, bit for bit its sequence-first
    outputs (token-axis outputs: ``OpCard.join_dims`` 1) and gradients; the rest (final states, their
    gradients) bit for bit as they are."""
    inputs = t.inputs()
    base = t.evaluate(inputs)
    moved = {n for n in inputs.tensors if n in t.op.token_axes}
    flipped = {n for n, dim in t.op.join_dims.items() if dim == 1} | {t.op.grad_name(n) for n in moved}

    def flip(name: str, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous() if name in moved or name in flipped else x

    turned = Inputs({n: flip(n, x) for n, x in inputs.tensors.items()}, inputs.positional,
                    {**inputs.options, "head_first": True})
    cotangents = {n: flip(n, c) for n, c in t.cotangents(base).items()}
    got = {n: flip(n, x) for n, x in t.evaluate(turned, cotangents).items()}

    def difference(n: str) -> str | None:
        if n not in got:
            return "not returned"
        if got[n].shape != base[n].shape:
            return f"shape {list(got[n].shape)}, not {list(base[n].shape)}"
        return None if same_bits(got[n], base[n]) else f"max abs diff {max_abs_diff(got[n], base[n]):.3e}"

    found = {n: d for n in base if (d := difference(n))}
    if found:
        t.fail("head_first=True on the transposed inputs is not bitwise the sequence-first result, transposed:\n"
               + "\n".join(f"  {n:<12} {d}" for n, d in found.items()))


def _offers_head_first(impl: registry.Implementation) -> str | None:
    return None if impl.head_first else "offers no head_first layout"


def fp16_gates(t: Trial) -> None:
    """Law 9: given fp16 gates, the implementation computes what it computes on ``g.float()`` of the
    same values (the gradient dg compared after rounding the fp32 run's to fp16)."""
    inputs = t.inputs()
    half = t.evaluate(inputs)
    full = t.evaluate(inputs.map(lambda n, x: x.float() if n == "g" else x), t.cotangents(half))
    full = {n: (x.to(half[n].dtype) if n in half and x.dtype != half[n].dtype else x) for n, x in full.items()}
    t.compare("fp16 gates against the same values as fp32", half, full)


def gate_bounds(t: Trial) -> None:
    """Law 10: the lower-bound gate lies in [lower_bound, 0] (the open interval of the math, closed
    by rounding: sigmoid saturates), the softplus gate in (-inf, 0]; both finite."""
    gate = t.evaluate(t.inputs())["gate"]
    low = t.case.opts.get("lower_bound")
    bad = ~torch.isfinite(gate) | (gate > 0)
    if low is not None:
        bad |= gate < low
    if bool(bad.any()):
        where = f"[{low}, 0]" if low is not None else "(-inf, 0]"
        t.fail(f"{int(bad.sum())} gate values outside {where}: e.g. {gate[bad][:4].tolist()}")


def gate_monotone(t: Trial) -> None:
    """Law 10: both gates are non-increasing in g: raising g (by a seeded non-negative amount,
    rounded in g's dtype so it never goes down) never raises the gate by more than the budget's
    relative error."""
    inputs = t.inputs()
    g = inputs.tensors["g"]
    gen = torch.Generator().manual_seed(t.case.seed + 2)
    step = torch.randn(g.shape, generator=gen).abs().to(g.device) * float(t.case.drawn.get("input_scale", 1.0))
    higher = inputs.map(lambda n, x: (x.double() + step).to(x.dtype) if n == "g" else x)
    low, high = t.evaluate(inputs)["gate"], t.evaluate(higher)["gate"]
    limit = verify.bound_of(t.impl, t.case, "gate", t.case.dtype, t.mode, grads=False)
    rise = (high.double() - low.double()) - limit.bound * low.double().abs()
    if bool((rise > 0).any()):
        i = int(rise.flatten().argmax())
        t.fail(f"gate rises with g at {int((rise > 0).sum())} elements beyond the relative budget "
               f"{limit.bound:.2g} ({limit.explanation}): e.g. g {g.flatten()[i].item():.4g} -> "
               f"{higher.tensors['g'].flatten()[i].item():.4g} "
               f"moves the gate {low.flatten()[i].item():.6g} -> {high.flatten()[i].item():.6g}")


def key_permutation(t: Trial) -> None:
    """Law 11: non-causal attention is invariant to permuting keys together with values (within
    each packed sequence): o and lse unchanged, dq unchanged, dk and dv permuted alike (compared
    after autograd maps them back). Within budget only: the softmax sums in another order."""
    case = t.case
    inputs = t.inputs()
    base = t.evaluate(inputs)
    gen = torch.Generator().manual_seed(case.seed + 3)
    spans = [k for _, k in t.op.spans(case)] if case.seqlens is not None else [(0, case.dim["S"])]
    perm = torch.arange(case.dim["S"])
    for ks, ke in spans:
        perm[ks:ke] = ks + torch.randperm(ke - ks, generator=gen)
    perm = perm.to(t.device)

    def shuffled(x: Inputs) -> dict:
        return t.call(x.map(lambda n, v: v[:, perm] if n in ("k", "v") else v))
    t.compare("keys and values permuted together", t.composite(inputs, shuffled, t.cotangents(base)), base,
              bitwise=False)   # the softmax sums in another order: bits cannot be expected to match


def rows_without_keys(t: Trial) -> None:
    """Law 11: lse matches the float64 truth within budget, and a query row that sees no key
    (causal with S < T, an empty key span) gets exactly o = 0 and lse = -inf, as the contract says
    (with sinks its lse is its head's sink: law 1 holds it to that)."""
    ref = verify.truth(t.case, False)
    out = t.evaluate(t.inputs())
    empty = torch.isneginf(ref["lse"]).to(out["o"].device)             # [B, H, T]
    rows = empty.transpose(1, 2)                                        # [B, T, H]
    if bool((out["o"][rows] != 0).any()):
        t.fail(f"o is not 0 on {int(rows.sum())} (row, head) pairs that see no key: e.g. "
               f"{out['o'][rows][:2].flatten()[:6].tolist()}")
    if "lse" not in registry.provides(t.impl):
        return
    if not bool(torch.isneginf(out["lse"][empty]).all()):
        t.fail(f"lse is not -inf on rows that see no key: e.g. {out['lse'][empty][:6].tolist()}")
    verdict = verify.measure(t.impl, t.case, {"lse": out["lse"]}, {"lse": ref["lse"]}, mode=t.mode,
                             grads=False, knobs=t.knob_args())
    if not verdict.passed:
        t.fail("lse not within budget of the float64 truth\n" + verdict.table(), verdict.signature)


POISON_INT = 2**30
"""What the margins of an integer input (cu_seqlens) hold: a sequence boundary far past any T."""
POISON_ALIGN = 16
"""Bytes: the views of ``reads_past_input`` keep the alignment a contiguous tensor has (16 bytes, what
vectorized and TMA loads need): their start always, their row stride where the row is a multiple."""


def _poison(n: int, dtype: torch.dtype, device, nan_at: int) -> torch.Tensor:
    """``n`` poison values: NaN at ``nan_at`` and every second position from there, between them
    alternately +big and -big (the dtype's largest finite value, at most 1e30); integers: ``POISON_INT``."""
    if not dtype.is_floating_point:
        return torch.full((n,), POISON_INT, dtype=dtype, device=device)
    big = min(1e30, torch.finfo(dtype).max)
    cycle = torch.tensor([math.nan, big, math.nan, -big], dtype=torch.float64)
    return cycle[(torch.arange(n) - nan_at) % 4].to(dtype).to(device)


def in_poisoned_buffer(x: torch.Tensor, *, strided: bool = True) -> torch.Tensor:
    """``x``'s values in a view into a larger buffer of ``_poison``, its start 16-byte aligned
    (``POISON_ALIGN``), more than a row of poison before the start and after the end (a row: the last
    dimension, or all of a tensor of rank < 2; what comes before is a multiple of 16 bytes, so at
    least 16 bytes of it). ``strided`` (rank >= 2): each row followed by ``16 bytes + d % 2`` elements
    of poison (strides; unit stride in the last dimension kept) and the element right after every
    row NaN; else the view is contiguous (``x``'s shape, contiguous strides and dtype: what a wrapper
    that makes its inputs contiguous passes on unchanged) and the poison begins right before its
    first element and right after its last. Either way the element right after the end is NaN."""
    align = max(1, POISON_ALIGN // x.element_size())
    flat = x.ndim < 2
    d = x.numel() if flat else x.shape[-1]
    rows = 1 if flat else math.prod(x.shape[:-1])
    width = d if flat or not strided else d + align + d % 2     # even: every row end falls on a NaN
    lead = (width // align + 1) * align
    end = lead + rows * width - width + d                       # one past the last element
    buffer = _poison(lead + rows * width + width + align, x.dtype, x.device, nan_at=end)
    body = buffer[lead:lead + rows * width]
    view = body.view(x.shape) if width == d else body.view(*x.shape[:-1], width)[..., :d]
    return view.copy_(x.detach())


def in_poisoned_margins(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in a contiguous view into a larger buffer of poison, nothing between its rows:
    ``in_poisoned_buffer(x, strided=False)``."""
    return in_poisoned_buffer(x, strided=False)


POISON_LAYOUTS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "strided": (in_poisoned_buffer, "before its start, between its rows, after its end"),
    "contiguous": (in_poisoned_margins, "before its start, after its end"),
}
"""The layouts ``reads_past_input`` hands its inputs over in: the function that places an input, and
where its poison is."""


def _placed(place: Callable[[torch.Tensor], torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    """``place(x)``: an input in one of ``POISON_LAYOUTS`` (``Inputs.map`` passes the name too)."""
    return place(x)


def reads_past_input(t: Trial) -> None:
    """Law 12: an implementation reads its inputs where they are and nowhere else. Every tensor
    input (cu_seqlens included) is handed over in two layouts (``POISON_LAYOUTS``), each a view into
    a larger buffer of poison: ``strided`` (``in_poisoned_buffer``): poison before its start and after
    its end, and every row of the last dimension followed by poison, reached through the strides (the
    contract takes any strides; the unit stride of the last dimension is kept); ``contiguous``
    (``in_poisoned_margins``): the shape, contiguous strides and dtype of a plain input, the poison
    beginning right before its first element and right after its last. A wrapper that makes its
    inputs contiguous copies the strided views into fresh memory, where nothing past the end is
    poison; it passes the contiguous ones on, so a kernel behind it that reads past the end of an
    input (an unmasked load of its last row over a power-of-two number of lanes) reads poison. Both
    keep the 16-byte alignment of the start (``POISON_ALIGN``). Floating poison is NaN, +1e30 and -1e30
    (the dtype's largest value where smaller), NaN right after the end (and right after each row of
    the strided layout); integer poison 2**30. Forward and backward for each layout (the views are the
    leaves, their gradients compared), every output and gradient is finite wherever that of a run on
    the plain contiguous inputs is, and within budget of it (bitwise reported: a kernel that copies
    to contiguous memory computes the same bits). Three runs of the implementation per example."""
    inputs = t.inputs()
    plain = t.evaluate(inputs)
    cotangents = t.cotangents(plain)
    for layout, (place, where) in POISON_LAYOUTS.items():
        out = t.composite(inputs.map(functools.partial(_placed, place)), t.call, cotangents, fresh_leaves=False)
        what = f"inputs as {layout} views into poisoned buffers against the plain inputs"
        bad = _nonfinite(out, plain)
        if bad:
            t.fail(f"{what}: NaN/Inf where the plain run is finite: the {layout} layout let poison from outside "
                   f"an input ({where}) reach " + ", ".join(f"{n} ({c} elements)" for n, c in bad.items()))
        t.compare(what, out, plain)


# --- the registry of laws ------------------------------------------------------------------------

def _always(impl: registry.Implementation) -> str | None:
    return None


def _has_paths(impl: registry.Implementation) -> str | None:
    if len(path_knobs(impl)) > 1 or impl.triton:
        return None
    return "declares no path knobs (gather, recompute, chunk size) and no autotuned kernels"


def _has_precision(impl: registry.Implementation) -> str | None:
    if not set(PRECISION_MODES) <= set(impl.knobs.get("precision", ())):
        return "has no precision knob with ieee, tf32 and tf32x3"
    if "fp32" not in impl.dtypes:
        return "does not take fp32 inputs"
    return None


def _cut(impl, case: Case) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"cut": st.integers(0, case.dim["T"] - 2)})


def grouped_heads(t: Trial) -> None:
    """Law 14: a call with grouped heads (gated_delta_rule's HV value heads over H query/key heads,
    attention's H query heads over Hk key/value heads) equals the call with each shared head repeated
    for every head of its group (``repeat_interleave`` on the head axis: head j reads head j // G):
    the same outputs, and the shared inputs' gradients equal the repeated ones' summed over each group
    (autograd sums them through the repeat). Outputs and the other gradients are compared bit for bit
    (noted); the summed gradients, added in an order no single run shares, within budget."""
    grouping = t.op.grouping
    groups = grouping.groups(t.case)
    inputs = t.inputs()
    grouped = t.evaluate(inputs)

    def repeated(x: Inputs) -> dict:
        return t.call(x.map(lambda n, v: v.repeat_interleave(groups, dim=2) if n in grouping.inputs else v))
    dense = t.composite(inputs, repeated, t.cotangents(grouped))
    t.compare(f"{groups} heads per group against the call with each shared head repeated {groups} times", grouped,
              dense, summed=tuple(t.op.grad_name(n) for n in grouping.inputs))


def window_locality(t: Trial, *, row: int) -> None:
    """Law 16: changing the keys and values a query does not see (outside its sliding window, after its
    diagonal where causal, in another packed sequence: ``OpCard.unseen``) leaves its output and, with an
    upstream gradient at that query only, every gradient unchanged: within budget and bit for bit
    (noted). Causality's key side is its special case."""
    case, op = t.case, t.op
    hidden = op.unseen(case, row)
    if not bool(hidden.any()):
        t.vacuous(f"query {row} sees every key")
    base_in = t.inputs()

    def at_row_only(outputs):
        cts = t.cotangents(outputs)
        for name, dim in op.join_dims.items():
            if name in cts:
                keep = torch.zeros(cts[name].shape[dim], dtype=cts[name].dtype, device=cts[name].device)
                keep[row] = 1
                cts[name] = cts[name] * keep.view([-1 if i == dim else 1 for i in range(cts[name].dim())])
        return cts

    def at_row(res):
        return {n: x.narrow(op.join_dims[n], row, 1) if n in op.join_dims else x for n, x in res.items()}
    before = t.evaluate(base_in, at_row_only)
    after = t.evaluate(_changed(t, base_in, {"k": hidden}), at_row_only)
    t.compare(f"query {row} after changing the {int(hidden.sum())} keys it does not see", at_row(after), at_row(before))


def _row(impl, case: Case) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"row": st.integers(0, case.dim["T"] - 1)})


def sinks_neutral(t: Trial) -> None:
    """Law 17: a sink of -inf is no sink: every head's sink at -inf gives the outputs and gradients of the
    call without sinks (within budget and bit for bit, noted), and a gradient of exactly 0 to the sinks."""
    inputs = t.inputs()
    plain = Inputs({n: x for n, x in inputs.tensors.items() if n != "sinks"}, inputs.positional, inputs.options)
    gone = inputs.map(lambda n, x: torch.full_like(x, -math.inf) if n == "sinks" else x)
    with_sinks, without = t.evaluate(gone), t.evaluate(plain)
    dsinks = with_sinks.pop(t.op.grad_name("sinks"), None)
    if dsinks is not None and bool((dsinks != 0).any()):
        t.fail(f"sinks of -inf get a gradient other than 0: {dsinks.tolist()}")
    t.compare("sinks of -inf against no sinks", with_sinks, without)


def inputs_rewritten(t: Trial) -> None:
    """Law 18: new values written into the same input tensors (the same addresses, shapes and dtypes)
    after a call give, on the next call, the truth of the new values: outputs and gradients within
    budget of the float64 reference. A result cached by pointer or by shape, or read from a buffer
    the first call left, shows the old values."""
    x = t.inputs()
    t.composite(x, t.call, fresh_leaves=False)
    new = t.case.replace(seed=t.case.seed ^ 0xDA7A)
    fresh = t.inputs(new)
    with torch.no_grad():
        for name, tensor in x.tensors.items():
            if tensor.is_floating_point():
                tensor.copy_(fresh.tensors[name])
                tensor.grad = None
    out = t.composite(x, t.call, lambda result: verify.upstream_gradients(t.op, new, result), fresh_leaves=False)
    ref = verify.truth(new, t.grads, verify.cotangent_names(t.op, registry.provides(t.impl)))
    verdict = verify.measure(t.impl, new, out, ref, mode=t.mode, grads=t.grads, knobs=t.knob_args())
    if not verdict.passed:
        t.fail("after new values were written into the same input tensors, the next call is not within budget "
               f"of their float64 truth ({new.describe()})\n{verdict.table()}", verdict.signature)


DECODE_STEPS = 8
"""At most this many one-token calls in law ``decode_equals_prefill`` (each a launch, and a backward)."""


def decode_equals_prefill(t: Trial, *, prefill: int) -> None:
    """Law 15: serving's decode: one call over the first ``prefill`` tokens (none when 0) with
    output_final_state, then one call per remaining token, each starting from the state the previous
    call returned, give the outputs, final state and gradients of one call over every token (the
    gradients flow back through each carried state). At most ``DECODE_STEPS`` one-token calls."""
    case, op = t.case, t.op
    inputs = t.inputs()
    whole = t.evaluate(inputs)
    total = case.dim["T"]

    def decoded(x: Inputs) -> dict:
        outputs, state = [], x.tensors.get("initial_state")
        spans = ([(0, prefill)] if prefill else []) + [(i, i + 1) for i in range(prefill, total)]
        for start, end in spans:
            step = op.piece(x, (start, end))
            if state is None:
                step.tensors.pop("initial_state", None)
            else:
                step.tensors["initial_state"] = state
            last = end == total
            out = t.call(step) if last else t.call(step, output_final_state=True)
            if not last and "final_state" not in out:
                t.fail("returned no final state with output_final_state=True")
            outputs.append(out["o"])
            state = out.get("final_state")
        return {"o": torch.cat(outputs, 1), "final_state": state}
    t.compare(f"one call against {f'a prefill of {prefill} tokens, then ' if prefill else ''}one-token calls, "
              "each from the state the previous one returned", whole,
              t.composite(inputs, decoded, t.cotangents(whole)), sums=True)


POOL_SPARE_SLOTS = 3
"""Slots of the pool in law ``state_pool`` that no sequence names (the first holds NaN)."""


def state_pool(t: Trial) -> None:
    """Law 19: serving's decode over a state pool. One token per sequence, each sequence's state read
    from the pool slot ``ssm_state_indices`` names and its final state written back there in place
    (``inplace_final_state``), gives the outputs and final states of the same call given those states
    directly (``initial_state=pool[indices]``, ``output_final_state``): within budget and bit for bit
    (noted). Every slot no sequence names (one holds NaN) and every other input stay bitwise unchanged:
    the pool's named slots are the one side effect the contract allows. Forward only (decode)."""
    case, op = t.case, t.op
    step = op.piece(t.inputs(), (0, 1))
    with torch.no_grad():
        states = step.tensors.get("initial_state")
        if states is None:      # the states this kernel reaches after one token from zero
            states = t.call(step, output_final_state=True).get("final_state")
            if states is None:
                t.fail("returned no final state with output_final_state=True")
        n = states.shape[0]
        gen = torch.Generator().manual_seed(case.seed ^ 0x9001)
        slots = torch.randperm(n + POOL_SPARE_SLOTS, generator=gen)
        named, spare = slots[:n].to(states.device), slots[n:].to(states.device)
        pool = torch.randn((n + POOL_SPARE_SLOTS, *states.shape[1:]), generator=gen).to(states)
        pool[named] = states.float()
        pool[spare[0]] = float("nan")
        given = Inputs({**step.tensors, "initial_state": pool[named].clone()}, step.positional, step.options)
        direct = t.call(given, output_final_state=True)
        pooled = Inputs({**step.tensors, "initial_state": pool.clone(), "ssm_state_indices": named.clone()},
                        step.positional, step.options)
        before = {name: x.clone() for name, x in pooled.tensors.items()}
        out = t.call(pooled, output_final_state=False, inplace_final_state=True)
    written = pooled.tensors["initial_state"]
    if out.get("final_state") is not None:
        t.fail("returned a final state with inplace_final_state=True (the final states belong in the pool)")
    touched = [int(s) for s in spare if not same_bits(written[s], before["initial_state"][s])]
    if touched:
        t.fail(f"changed pool slot(s) {touched}, which no sequence names (ssm_state_indices {named.tolist()})")
    changed = [name for name, x in pooled.tensors.items() if name != "initial_state" and not same_bits(x, before[name])]
    if changed:
        t.fail("modified inputs other than the pool's named slots in place: " + ", ".join(changed))
    t.compare(f"a decode step over a pool of {n + POOL_SPARE_SLOTS} states (slots {named.tolist()}) against "
              "the same step given those states", {"o": out["o"], "final_state": written[named]},
              {"o": direct["o"], "final_state": direct["final_state"]})


def pages_shuffled(t: Trial) -> None:
    """Law 20: a paged cache is read through its block table and nowhere else. The same cache with its
    pages moved to other places of the pool (a seeded permutation, the block table renumbered to match)
    gives the same outputs: within budget and bit for bit (noted); and every row no sequence's tokens
    occupy (spare pages, the rows of a last page past the sequence's length, the pages named by the
    table's entries past a sequence's last page) may hold NaN without effect: that memory belongs to no
    sequence (a freed page, the rows the next tokens will fill) and holds whatever was there, NaN bit
    patterns of uninitialized memory included; a kernel loads it masked, not as 0 times its value."""
    paging = t.op.paging
    x = t.inputs()
    plain = t.evaluate(x)
    used = paging.used_rows(t.case, x)
    pages = used.shape[0]
    gen = torch.Generator().manual_seed(t.case.seed ^ 0x5A6E)
    place = torch.randperm(pages, generator=gen)            # page p moves to place[p]
    moved = {}
    for name in paging.caches:
        cache = x.tensors[name].clone()
        cache[~used.to(cache.device)] = float("nan")
        shuffled = torch.empty_like(cache)
        shuffled[place.to(cache.device)] = cache
        moved[name] = shuffled
    table = x.tensors[paging.table]
    moved[paging.table] = place.to(table.device)[table.long()].to(table.dtype)
    out = t.evaluate(Inputs({**x.tensors, **moved}, x.positional, x.options))
    unused = int((~used).sum())
    bad = _nonfinite(out, plain)
    if bad:
        t.fail(f"with its pages moved and the {unused} unoccupied cache rows NaN: NaN/Inf reached "
               + ", ".join(f"{n} ({c} elements)" for n, c in bad.items()) + ": it reads rows its block table "
               "and lengths do not give it")
    t.compare(f"the cache's {pages} pages moved in the pool (block table renumbered), its {unused} unoccupied "
              "rows NaN", out, plain)


def queries_one_at_a_time(t: Trial) -> None:
    """Law 21: speculative decoding's check of Tq draft tokens in one call gives, for each query, what
    decoding it alone gives: query i of Tq alone, against the cache of each sequence up to its own token
    (``lengths - (Tq - 1 - i)``), equals row i of the call over all Tq: within budget and bit for bit (noted)."""
    paging, case = t.op.paging, t.case
    x = t.inputs()
    whole = t.evaluate(x)
    total = case.dim["T"]
    rows = []
    queries = [n for n, axis in t.op.token_axes.items() if axis == "q" and n in x.tensors]
    for i in range(total):
        one = Inputs({**x.tensors, **{n: x.tensors[n][:, i:i + 1] for n in queries},
                      paging.lengths: x.tensors[paging.lengths] - (total - 1 - i)}, x.positional, x.options)
        rows.append(t.evaluate(one))
    joined = {n: torch.cat([r[n] for r in rows], t.op.join_dims[n]) for n in whole}
    t.compare(f"{total} queries in one call against each query alone with the cache up to its token", joined, whole)


def _prefill(impl, case: Case) -> st.SearchStrategy[dict]:
    total = case.dim["T"]
    return st.fixed_dictionaries({"prefill": st.integers(max(0, total - DECODE_STEPS), total - 1)})


def _declining(extension: str | None, impl: registry.Implementation) -> str | None:
    """Why a law about ``extension`` does not apply to ``impl``: it declines the extension (else None)."""
    if extension is not None and extension in card(impl.op).declined(impl):
        return f"declines extension {extension}"
    return None


def _offers_grouping(impl: registry.Implementation) -> str | None:
    grouping = card(impl.op).grouping
    return _declining(grouping.extension if grouping is not None else None, impl)


def _offers_state_pool(impl: registry.Implementation) -> str | None:
    return _declining("state_pool", impl)


def _split(impl, case: Case) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"split": st.integers(1, case.dim["T"] - 1)})


@dataclass(frozen=True)
class Law:
    """A law: its function ``fn(trial, **params)``, the traits an op needs for it to apply
    (``refcheck.model.ops.TRAITS``; those its requirements concern are implied), the requirements its
    cases meet (``refcheck.model.ops.REQUIREMENTS``: they draw the cases and check fixed ones), whether it
    applies to an implementation (``applies(impl)`` -> None or why not), its own parameters
    (``params(impl, case)`` -> a strategy of dicts) and its cost in implementation runs per example
    (the ci profile divides its example count by it). It applies to every op, built-in or a user's,
    whose card has the traits: no law names an op."""

    name: str
    number: str
    fn: Callable
    traits: frozenset[str] = frozenset()
    requires: Mapping = field(default_factory=dict)
    applies: Callable[[registry.Implementation], str | None] = _always
    params: Callable | None = None
    cost: float = 1.0

    @property
    def needs(self) -> frozenset[str]:
        """The traits an op needs: the law's own and those of its requirements."""
        implied = {REQUIREMENTS[key].trait for key in self.requires}
        return frozenset(self.traits) | {t for t in implied if t is not None}

    @property
    def ops(self) -> tuple[str, ...]:
        """The known ops it applies to (their cards have every trait it needs)."""
        return tuple(name for name, c in OPS.items() if self.why_not_op(c) is None)

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()

    def why_not_op(self, op_card) -> str | None:
        """None when the law applies to the op of ``op_card``, else why not."""
        missing = self.needs - op_card.traits
        if missing:
            return f"law {self.name} needs an op with trait(s) {', '.join(sorted(missing))}; {op_card.name} has none"
        return None

    def why_not(self, impl: registry.Implementation) -> str | None:
        """None when the law applies to ``impl``, else why not."""
        why = self.why_not_op(card(impl.op))
        if why:
            return why
        if "dtype" in self.requires and self.requires["dtype"] not in impl.dtypes:
            return f"needs {self.requires['dtype']} inputs"
        declined = card(impl.op).declined(impl)
        for key, want in self.requires.items():
            extension = REQUIREMENTS[key].extension
            if want and extension in declined:
                return f"declines extension {extension}"
        return self.applies(impl)


LAWS: dict[str, Law] = {law.name: law for law in (
    Law("agreement", "1", agreement),
    Law("causality", "2, 11", causality, requires={"min_len": 2, "causal": True}, params=_cut, cost=2),
    Law("varlen_equals_separate", "3", varlen_equals_separate, requires={"varlen": True, "min_seqs": 2}, cost=3),
    Law("batch_invariance", "3", batch_invariance, requires={"min_batch": 2}, cost=3),
    Law("state_chaining", "4", state_chaining, frozenset({"state", "causal"}), {"min_len": 2}, params=_split,
        cost=3),
    Law("determinism", "5", determinism, cost=2),
    Law("no_side_effects", "6", no_side_effects, cost=2),
    Law("path_agreement", "7", path_agreement, applies=_has_paths, cost=5),
    Law("precision_modes", "8", precision_modes, requires={"dtype": "fp32"}, applies=_has_precision, cost=4),
    Law("fp16_gates", "9", fp16_gates, requires={"gate_dtype": "fp16"}, cost=2),
    Law("gate_bounds", "10", gate_bounds, frozenset({"gate_function"})),
    Law("gate_monotone", "10", gate_monotone, frozenset({"gate_function"}), cost=2),
    Law("key_permutation", "11", key_permutation, requires={"causal": False, "min_keys": 2, "window": False}, cost=2),
    Law("rows_without_keys", "11", rows_without_keys, requires={"rows_without_keys": True}),
    Law("reads_past_input", "12", reads_past_input, cost=3),
    Law("head_first", "13", head_first, requires={"varlen": False}, applies=_offers_head_first, cost=2),
    Law("grouped_heads", "14", grouped_heads, requires={"grouped": True}, applies=_offers_grouping, cost=2),
    Law("decode_equals_prefill", "15", decode_equals_prefill, frozenset({"state", "causal"}),
        {"min_len": 2, "varlen": False}, params=_prefill, cost=4),
    Law("window_locality", "16", window_locality, requires={"window": True}, params=_row, cost=2),
    Law("sinks_neutral", "17", sinks_neutral, requires={"sinks": True}, cost=2),
    Law("inputs_rewritten", "18", inputs_rewritten, cost=2),
    Law("state_pool", "19", state_pool, frozenset({"state", "state_pool"}), {"varlen": False, "min_len": 1},
        applies=_offers_state_pool, cost=3),
    Law("pages_shuffled", "20", pages_shuffled, frozenset({"paged"}), cost=2),
    Law("queries_one_at_a_time", "21", queries_one_at_a_time, frozenset({"paged"}), {"min_len": 2}, cost=3),
)}


def law(name: str) -> Law:
    try:
        return LAWS[name]
    except KeyError:
        raise ValueError(f"unknown law {name!r}; known laws: {', '.join(LAWS)}") from None


# --- fixed examples -------------------------------------------------------------------------------

FIXED_PARAMS = {
    "cut": lambda case: (case.dim["T"] - 1) // 2,     # causality: change everything after mid-sequence
    "split": lambda case: case.dim["T"] // 2,         # state chaining: carry the state across mid-sequence
    "prefill": lambda case: max(0, case.dim["T"] - 3),  # decode: the last three tokens one at a time
    "row": lambda case: case.dim["T"] - 1,            # window locality: the last query (its window ends the keys)
}
"""A fixed value for each required parameter of a law (a keyword-only argument of its function
without a default), chosen from the case: mid-sequence, inside a chunk of a chunked kernel."""


def fixed_params(law, case) -> dict:
    """The law's required parameters, fixed for ``case`` (``FIXED_PARAMS``)."""
    params = {}
    for p in inspect.signature(law.fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            if p.name not in FIXED_PARAMS:
                raise ValueError(f"law {law.name}: no fixed value for its parameter {p.name!r} "
                                 "(add one to refcheck.engine.laws.FIXED_PARAMS)")
            params[p.name] = FIXED_PARAMS[p.name](case)
    return params


# --- running laws --------------------------------------------------------------------------------

def check(law_: Law | str, impl: registry.Implementation, example: Example, *, device: str = "cpu",
          strict: bool | None = None) -> Outcome:
    """Run one law on one example; raises ``LawViolation``, else returns the bitwise notes."""
    law_ = law(law_) if isinstance(law_, str) else law_
    trial = Trial(law_, impl, example.case, example.mode, dict(example.knobs), dict(example.params), device,
                  strict_default() if strict is None else strict)
    try:
        law_.fn(trial, **example.params)
    except Exception as err:
        if workers.context_lost(device):   # this example crashed the GPU: it is the finding
            lines = str(err).splitlines() or [type(err).__name__]
            why = next((line.strip() for line in lines if "CUDA error" in line), lines[0])
            message = trial.message(f"the CUDA context was lost{workers.crash_site(err)}: {why}")
            if workers.in_worker_process():         # the run replaces the worker and goes on
                workers.end_lost_process(message)
            raise LawViolation(message + "\n  (this process can no longer use the GPU)") from err
        raise
    return Outcome(law_.name, trial.notes)


INTERPRETED_SHARE = 0.4
"""The share of a profile's examples a Triton kernel gets in the CPU interpreter (seconds per call)."""


def interpreted(impl: registry.Implementation, device: str) -> bool:
    """Whether ``impl`` runs in the Triton interpreter on ``device``."""
    return impl.triton and torch.device(device).type == "cpu"


def examples_for(law_: Law, base: hsettings | None = None, *, interpreted: bool = False) -> int:
    """The example count of a law under a profile: the profile's ``max_examples`` divided by the
    law's cost, times ``INTERPRETED_SHARE`` for an interpreted kernel, at least 2."""
    base = base or hsettings()
    return max(2, math.ceil(base.max_examples / law_.cost * (INTERPRETED_SHARE if interpreted else 1.0)))


def boundary_examples(law_: Law, impl: registry.Implementation, mode: str | None = None) -> list[Example]:
    """The law's fixed examples at chunk boundaries (``examples.boundary_cases``): default knobs,
    the implementation's first mode (or ``mode``), the law's parameters fixed for the case."""
    return [Example(case, mode or impl.modes[0], path_knobs(impl)[0], fixed_params(law_, case))
            for case in boundary_cases(impl.op, impl, dict(law_.requires))]


def hypothesis_check(law_: Law | str, impl: registry.Implementation, *, settings: hsettings | None = None,
                     limits: Limits | None = None, mode: str | None = None, device: str = "cpu",
                     strict: bool | None = None, max_examples: int | None = None,
                     boundaries: bool = False, buckets: tuple = (), multiple: bool = True) -> list[str]:
    """Search for counterexamples to a law with Hypothesis (the current profile unless
    ``settings``; ``examples_for`` examples unless ``max_examples``; sizes ``SMALL``, or
    ``INTERPRETED`` for an interpreted kernel, unless ``limits``; with ``boundaries`` the fixed
    ``boundary_examples`` first; with ``buckets`` what a compiler specializes on drawn from those,
    ``refcheck.engine.buckets``); raise the shrunk example's ``LawViolation`` (distinct failures,
    ``violation``, each shrunk to its own example and raised together, ``combined``; without ``multiple``
    the first failure only, shrunk), else return the bitwise notes (one line per distinct check, with how
    many examples it concerned)."""
    law_ = law(law_) if isinstance(law_, str) else law_
    why = law_.why_not(impl)
    if why:
        raise ValueError(f"{impl.op}/{impl.name}: {why}")
    base = settings or hsettings()
    notes: dict[str, int] = {}

    def run(example: Example) -> None:
        for line in check(law_, impl, example, device=device, strict=strict).notes:
            key = line.split(" (max abs diff")[0]
            notes[key] = notes.get(key, 0) + 1

    # Separate database entries (and derandomized seeds) per law and implementation. Hypothesis reads
    # this private attribute off the test function; mypy knows no such attribute on a function.
    run._hypothesis_internal_add_digest = f"{law_.name}/{impl.op}/{impl.name}".encode()  # type: ignore[attr-defined]
    slow = interpreted(impl, device)
    limits = limits or (INTERPRETED if slow else SMALL)
    count = max_examples or examples_for(law_, base, interpreted=slow)
    test = hsettings(base, max_examples=count, report_multiple_bugs=multiple)(
        given(examples(law_, impl, limits, mode, buckets))(run))
    for fixed in reversed(boundary_examples(law_, impl, mode)) if boundaries else ():   # run in order of T
        test = example(fixed)(test)
    try:
        test()
    except BaseExceptionGroup as group:   # distinct failures (``violation``), each with its minimal example
        raise combined(group, law_.name) from None
    return [f"{line} in {count} example(s)" for line, count in notes.items()]
