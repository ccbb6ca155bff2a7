"""The pipeline: case -> implementation and float64 truth -> errors -> budgets -> verdict.

Every loop of refcheck (pytest laws, ``refcheck report``, ``drift record``, ``fuzz``) measures an
implementation through ``verify`` or its parts here, so an error is computed one way only.

For a case, the truth is the op's float64 reference on the same (already rounded) input values;
with gradients, both sides are differentiated against the same seeded upstream gradient (rounded
to the output's contract dtype), so ``dq`` of an implementation and ``dq`` of the truth answer the
same question.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from ..model import budgets as budgets_mod
from ..model import registry
from ..model.case import DTYPE_NAMES, Case
from ..model.metrics import rel_rms
from ..model.monte_carlo import random_rounding
from ..model.ops import Inputs, OpCard, card
from .oneliner import one_liner

CHUNKED_TRUTH_MIN_T = 256
"""From this sequence length on, the truth uses the float64 chunk form (equal to ~1e-12)."""


@dataclass
class Measurement:
    """One output's error against its budget; ``naive_error`` and ``naive_form`` are the yardstick of
    a ``naive_ratio`` bound (``yardstick``), ``dtype`` the dtype whose budget applies."""

    output: str
    error: float
    bound: float
    budget: budgets_mod.Budget
    naive_error: float | None = None
    naive_form: str = ""
    dtype: str = ""
    computing: Measurement | None = None
    monte_carlo: MonteCarloBound | None = None   # the second stage, where the first did not hold

    @property
    def passed(self) -> bool:
        return self.error <= self.bound

    @property
    def explanation(self) -> str:
        """What the bound is made of (``Budget.explain``, and a cancellation's allowance)."""
        text = self.budget.explain(self.naive_error, self.naive_form, self.dtype)
        if self.computing is not None:
            text += f" + {self.computing.bound:.1e} for computing it in {self.computing.dtype} ({self.computing.explanation})"
        if self.monte_carlo is not None:
            text = f"{self.monte_carlo.explanation}; the first stage gave {self.first_bound:.2e} = {text}"
        return text

    @property
    def first_bound(self) -> float:
        """The cheap bound (factor x naive error + slack, or the fixed one), before the Monte Carlo stage."""
        return self.bound if self.monte_carlo is None else self.monte_carlo.first

    @property
    def headroom(self) -> float:
        """bound / error: how many times the error could grow before failing (inf when exact)."""
        return math.inf if self.error == 0 else self.bound / self.error


@dataclass(frozen=True)
class MonteCarloBound:
    """The second stage of a ``naive_ratio`` bound (``monte_carlo_bound``): ``factor`` x the Monte Carlo
    error of the reference on the case + ``ulps`` x eps of the stored dtype; ``first`` is the bound of
    the first stage it replaced (it is only ever larger)."""

    bound: float
    error: float
    form: str
    dtype: str        # the precision modelled ("fp32", "tf32", "bf16": ``unit_roundoffs``)
    stored: str       # the output's stored dtype, whose eps is the floor
    settings: budgets_mod.MonteCarlo
    first: float = 0.0
    samples: int = 0  # drawn: fewer than the settings' where the screen failed it (``screened``)
    margin: float = 0.0  # the screen's margin where it did

    @property
    def explanation(self) -> str:
        drawn = f"{self.samples} samples" if self.samples >= self.settings.samples else \
            f"{self.samples} of {self.settings.samples} samples: the error is over {self.margin:g}x this"
        return (f"{self.settings.factor:g} x the Monte Carlo {self.dtype} error of the reference on this case "
                f"({drawn}, {self.form} form), {self.error:.1e}, + {self.settings.ulps:g} ulp of "
                f"{self.stored} [monte_carlo]")


@dataclass
class Verdict:
    """Every measured output of one implementation on one case, with contract violations."""

    op: str
    impl: str
    case: Case
    mode: str
    knobs: dict
    measurements: list[Measurement] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    record: registry.Implementation | None = None   # the implementation measured (for the reproducer)

    @property
    def passed(self) -> bool:
        return not self.problems and all(m.passed for m in self.measurements)

    @property
    def signature(self) -> str:
        """Which failure this is: whether the first output over its bound is a forward output or a gradient,
        and the dtype of that bound (``"gradients fp32"``), or ``"contract"`` for a problem (an output missing,
        a wrong dtype); empty when passed. Coarse on purpose: a bug keeps its signature while Hypothesis
        shrinks it (an output-by-output signature changes with the case, and each one shrinks apart)."""
        if self.problems:
            return "contract"
        failed = next((m for m in self.measurements if not m.passed), None)
        if failed is None:
            return ""
        return f"{'outputs' if failed.output in card(self.op).outputs else 'gradients'} {failed.dtype}"

    def reproducer(self, device: str = "cpu") -> str:
        """A one-liner that measures this point again and fails while it is over budget
        (``refcheck.engine.reproduce.point``), from any folder, for a user's kernel too."""
        knobs = {k: v for k, v in self.knobs.items() if k != "precision"}
        args = [self.case.to_python(), f"mode={self.mode!r}"] + ([f"knobs={knobs!r}"] if knobs else []) \
            + ([f"device={device!r}"] if device != "cpu" else [])
        return one_liner("point", self.record or registry.get(self.op, self.impl), args)

    def table(self) -> str:
        head = f"{self.op} [{self.impl}] mode={self.mode} knobs={self.knobs}\n  case: {self.case.describe()}"
        rows = [f"  {m.output:<12} error {m.error:9.3e}  bound {m.bound:9.3e}  {'ok  ' if m.passed else 'FAIL'}"
                f"  bound = {m.explanation}" for m in self.measurements]
        rows += [f"  problem: {p}" for p in self.problems]
        return "\n".join([head, *rows])

    def failure_message(self, device: str = "cpu") -> str:
        return f"{self.table()}\n  reproduce: {self.reproducer(device)}"


def upstream_gradients(op: OpCard, case: Case, outputs: dict[str, torch.Tensor],
                       names: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """Seeded random cotangents for the outputs, rounded to each output's contract dtype.

    ``o`` is in the input dtype, every other output (states, lse, gates) in float32. Entries where
    an output is not finite (lse of a row that sees no key) get a zero cotangent. Each output's
    cotangent depends on the case only (drawn in the card's output order), so an implementation
    that returns fewer outputs gets the same cotangents for the ones it returns; ``names`` keeps
    only those outputs (the truth of an implementation without ``lse`` is differentiated without it).
    """
    gen = torch.Generator().manual_seed(case.seed + 1)
    grads = {}
    for name in op.outputs:
        if name not in outputs:
            continue
        x = outputs[name]
        g = torch.randn(x.shape, generator=gen).to(output_dtype(case, name)).to(x.device)
        if names is None or name in names:
            grads[name] = torch.where(torch.isfinite(x.detach()), g,
                                      torch.zeros((), dtype=g.dtype, device=g.device))
    return grads


def leaf_inputs(op: OpCard, inputs: Inputs) -> tuple[Inputs, dict[str, torch.Tensor]]:
    """A copy of ``inputs`` whose differentiable float tensors are fresh autograd leaves, and the leaves."""
    leaves = {}

    def leaf(name, t):
        if name in op.differentiable and t.is_floating_point():
            leaves[name] = t.detach().clone().requires_grad_(True)
            return leaves[name]
        return t

    return inputs.map(leaf), leaves


def backprop(op: OpCard, result: dict[str, torch.Tensor], cotangents: dict[str, torch.Tensor],
             leaves: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Backpropagate ``cotangents`` from the outputs in ``result`` to ``leaves``; returns the
    detached outputs plus each leaf's gradient as ``d<name>`` (``dh0`` for the initial state)."""
    pairs = [(result[n], cotangents[n]) for n in cotangents if n in result and result[n].requires_grad]
    if pairs:
        torch.autograd.backward([p[0] for p in pairs], [p[1].to(p[0].dtype) for p in pairs])
    result = dict(result)
    for name, t in leaves.items():
        if t.grad is not None:
            result[op.grad_name(name)] = t.grad
    return {n: t.detach() for n, t in result.items()}


def evaluate(fn, op: OpCard, inputs: Inputs, *, grads: bool, cotangents=None, **knobs) -> dict[str, torch.Tensor]:
    """Run ``fn`` on ``inputs``; with ``grads``, backpropagate ``cotangents`` (or fresh ones from
    ``cotangents(outputs)``) and add each differentiable input's gradient as ``d<name>``."""
    leaves: dict[str, torch.Tensor] = {}
    if grads:
        inputs, leaves = leaf_inputs(op, inputs)
    with torch.set_grad_enabled(grads):
        called = op.fit_call(fn, inputs)
        result = op.split(called.call(fn, **knobs), called)
    if not grads:
        return {n: t.detach() for n, t in result.items()}
    return backprop(op, result, cotangents(result) if callable(cotangents) else cotangents, leaves)


def cotangent_names(op: OpCard, provides) -> tuple[str, ...] | None:
    """The outputs whose cotangents the truth takes for an implementation returning ``provides``
    (None: all of them, the common case, so that the cache holds one truth per case)."""
    names = tuple(n for n in op.outputs if n in provides)
    return None if names == op.outputs else names


REFERENCE_DEVICE = torch.device("cpu")
"""Where the float64 truth and the naive forms are evaluated, whatever the implementation's device:
the inputs are drawn on the CPU (``OpCard.make_inputs``), so the numbers are the same, and the
references' Python loops of small kernels would time-slice a GPU shared by several worker processes
(measured on an H100, 8 processes: 16 s per example of chunk_simple_gla at T <= 1100, 0 s of it
compiling; on one CPU core the truth and both naive forms of the largest such case take 1.5-3 s)."""


@lru_cache(maxsize=256)
def truth(case: Case, grads: bool = True, outputs: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """The float64 reference outputs (and gradients) of a case, on ``REFERENCE_DEVICE``; cached,
    since every implementation, mode and knob setting of a case shares it. The gradients
    backpropagate the cotangents of ``outputs`` only (default all): those an implementation returns
    (torch SDPA has no ``lse``)."""
    op = card(case.op)
    fn = op.chunked_reference if op.chunked_reference and case.dim.get("T", 0) >= CHUNKED_TRUTH_MIN_T else op.reference
    inputs = op.make_inputs(case, REFERENCE_DEVICE).to_float64()
    return evaluate(fn, op, inputs, grads=grads, cotangents=lambda out: {
        n: g.to(torch.float64) for n, g in upstream_gradients(op, case, out, outputs).items()})


def run(impl: registry.Implementation, case: Case, device: str = "cpu", grads: bool = True,
        **knobs) -> dict[str, torch.Tensor]:
    """Outputs (and, if it has a backward, gradients) of an implementation on a case."""
    op = card(case.op)
    inputs = op.make_inputs(case, torch.device(device))
    return evaluate(impl.fn, op, inputs, grads=grads and impl.backward,
                    cotangents=lambda o: upstream_gradients(op, case, o), **knobs)


@lru_cache(maxsize=256)
def naive_outputs(case: Case, grads: bool = True, outputs: tuple[str, ...] | None = None,
                  form: str = "recurrent") -> dict[str, torch.Tensor]:
    """The results of a naive form (``registry.NAIVE_FORMS``: the reference evaluated in the input
    dtype) on a case, on ``REFERENCE_DEVICE``, cotangents of ``outputs`` only (as ``truth``)."""
    op = card(case.op)
    return evaluate(registry.get(case.op, registry.NAIVE_FORMS[form]).fn, op,
                    op.make_inputs(case, REFERENCE_DEVICE),
                    grads=grads, cotangents=lambda o: upstream_gradients(op, case, o, outputs))


def yardstick(case: Case, name: str, floor: float, *, grads: bool = True,
              outputs: tuple[str, ...] | None = None) -> tuple[float | None, str]:
    """The naive error of output ``name`` on ``case``: the largest relative RMS error against the
    float64 truth among the naive forms of the op (the reference evaluated in the input dtype,
    recurrent, and chunked with decays differenced as kernels do), and which form it was. A form
    whose result is not finite (an overflow of the input dtype) is no yardstick; ``(None, "")``
    when none is."""
    base = truth(case, grads, outputs)
    errors = {}
    for form in registry.naive_forms(case.op):
        out = naive_outputs(case, grads, outputs, form)
        if name in out and name in base:
            error = rel_rms(out[name], base[name], floor=floor)
            if math.isfinite(error):
                errors[form] = error
    if not errors:
        return None, ""
    form = max(errors, key=errors.__getitem__)
    return errors[form], form


def unit_roundoffs(case: Case, mode: str) -> tuple[float, float, str]:
    """``(u, u of dots, name)``: the unit roundoff of the case's input dtype, and of its matrix products.
    For fp32 inputs in mode tf32 both are tf32's ``2^-11``: every quantity a kernel derives from a tf32
    dot carries its error (a gate gradient formed as ``q * dq - k * dk`` from tf32 ``dq``, ``dk`` leaves
    a residue of 2^-11 of its terms, which no float64 formula forms); tf32x3 keeps about fp32's."""
    u = torch.finfo(case.torch_dtype).eps / 2
    if case.dtype == "fp32" and mode == "tf32":
        return 2.0 ** -11, 2.0 ** -11, "tf32"
    return u, u, case.dtype


MONTE_CARLO_RECURRENT_MAX_T = 8
"""Up to this sequence length the Monte Carlo stage runs the recurrent form beside the chunked one; past it
the chunk form alone: a step-by-step float64 recurrence under the dispatch mode costs a Python loop of
small ops per token (KDA at T = 27: 1.5 s a sample, its chunk form 0.23 s; at T = 200 tens of seconds). The
degenerate cases whose roundings one evaluation order hides (one token, one key, a state that meets no
decay) are short."""


def monte_carlo_forms(case: Case) -> tuple[str, ...]:
    """The forms a Monte Carlo evaluation runs (as ``yardstick`` runs the naive ones): the reference as
    written (where the op has no chunk form, or the sequence is short: ``MONTE_CARLO_RECURRENT_MAX_T``)
    and its chunk form as kernels compute it (``OpCard.chunk_options``)."""
    if card(case.op).chunked_reference is None:
        return ("recurrent",)
    short = case.dim.get("T", 0) <= MONTE_CARLO_RECURRENT_MAX_T
    return ("recurrent", "chunked") if short else ("chunked",)


@lru_cache(maxsize=512)
def monte_carlo_sample(case: Case, grads: bool, outputs: tuple[str, ...] | None, form: str, mode: str,
                       k: int) -> dict[str, torch.Tensor]:
    """Sample ``k`` of the float64 reference (in ``form``) on the case under Monte Carlo arithmetic at the
    precision of the case's dtype and ``mode`` (``refcheck.model.monte_carlo``), with the truth's
    cotangents; seeded by the case and ``k``, so reproducible; cached."""
    op = card(case.op)
    fn = op.form(form)
    inputs = op.make_inputs(case, REFERENCE_DEVICE).to_float64()
    base = truth(case, grads, outputs)
    cotangents = {n: g.to(torch.float64) for n, g in upstream_gradients(op, case, base, outputs).items()}
    u, u_dot, _ = unit_roundoffs(case, mode)
    with random_rounding(u, (case.seed * 1_000_003 + k * 7_919 + len(form)) % 2 ** 62, u_dot):
        return evaluate(fn, op, inputs, grads=grads, cotangents=cotangents)


def monte_carlo_error(case: Case, name: str, floor: float, mode: str, *, grads: bool = True,
                      outputs: tuple[str, ...] | None = None, budgets: budgets_mod.Budgets | None = None,
                      samples: int | None = None) -> tuple[float | None, str]:
    """What rounding in the case's precision costs output ``name`` on this case, whatever the order of
    operations: the RMS over Monte Carlo samples (``samples``, default the budgets') of their relative RMS
    error against the float64 truth (``rel_rms``, floor ``floor``), the larger of the forms
    (``monte_carlo_forms``), and which form. A form with a non-finite sample is no yardstick; ``(None, "")``
    when none is."""
    settings = (budgets or budgets_mod.load()).monte_carlo
    assert settings is not None
    base = truth(case, grads, outputs)
    errors = {}
    for form in monte_carlo_forms(case) if name in base else ():
        runs = [monte_carlo_sample(case, grads, outputs, form, mode, k) for k in range(samples or settings.samples)]
        each = [rel_rms(r[name], base[name], floor) if name in r else math.inf for r in runs]
        if all(math.isfinite(e) for e in each):
            errors[form] = math.sqrt(sum(e * e for e in each) / len(each))
    if not errors:
        return None, ""
    form = max(errors, key=errors.__getitem__)
    return errors[form], form


def monte_carlo_bound(case: Case, name: str, stored: torch.dtype, mode: str, floor: float, *, grads: bool = True,
                      outputs: tuple[str, ...] | None = None, budgets: budgets_mod.Budgets | None = None,
                      samples: int | None = None) -> MonteCarloBound | None:
    """The second stage of a ``naive_ratio`` bound on output ``name``: ``factor`` x its Monte Carlo
    error (``monte_carlo_error``) + ``ulps`` x eps of its ``stored`` dtype (``[monte_carlo]`` of the
    budgets). Only asked for where an output exceeds the first stage, so its cost (``samples``
    float64 evaluations per form, cached per case) is paid before calling a kernel wrong, not on
    every example. None where no form gives a finite error."""
    budgets = budgets or budgets_mod.load()
    settings = budgets.monte_carlo
    assert settings is not None
    samples = samples or settings.samples
    error, form = monte_carlo_error(case, name, floor, mode, grads=grads, outputs=outputs, budgets=budgets,
                                    samples=samples)
    if error is None:
        return None
    eps = torch.finfo(stored).eps if stored.is_floating_point else 0.0
    return MonteCarloBound(settings.factor * error + settings.ulps * eps, error, form, unit_roundoffs(case, mode)[2],
                           DTYPE_NAMES.get(stored, str(stored)), settings, samples=samples)


SCREEN_SAMPLES = 2
"""The Monte Carlo stage first draws this many samples (``screened``): an output whose error is far above
the bound they give (``screen_margin``) fails without the others. A bug that Hypothesis shrinks fails
hundreds of examples, each of which would otherwise pay for every sample (the shrinking of a KDA
causality mutant: 12 s without the stage, 322 s with every sample drawn)."""


def screen_margin(elements: int) -> float:
    """How far above the ``SCREEN_SAMPLES``-sample bound an error of an output of ``elements`` elements must
    be to fail unscreened: each sample's error is an RMS over the elements, so the two samples' RMS is
    below 1/M of the spread with the chi-square probability P(chi2_k < k / M^2), k = 2 x elements. It is
    below 1e-6 for M = 4 from 8 elements on (k = 16), and for M = 1000 at one element (k = 2)."""
    return 4.0 if elements >= 8 else 1000.0


def screened(case: Case, name: str, value: torch.Tensor, error: float, mode: str, floor: float, *, grads: bool,
             outputs: tuple[str, ...] | None, budgets: budgets_mod.Budgets) -> MonteCarloBound | None:
    """The Monte Carlo bound of output ``name`` (whose ``error`` exceeds the first stage): from
    ``SCREEN_SAMPLES`` samples where those show it far above any rounding (``screen_margin``), else from all."""
    first = monte_carlo_bound(case, name, value.dtype, mode, floor, grads=grads, outputs=outputs, budgets=budgets,
                              samples=SCREEN_SAMPLES)
    if first is not None and error > screen_margin(value.numel()) * first.bound:
        return dataclasses.replace(first, margin=screen_margin(value.numel()))
    return monte_carlo_bound(case, name, value.dtype, mode, floor, grads=grads, outputs=outputs, budgets=budgets)


def output_dtype(case: Case, name: str) -> torch.dtype:
    """The contract dtype of an output: ``o`` in the input dtype, every other output (states, lse,
    gates) float32."""
    return case.torch_dtype if name == "o" else torch.float32


def computed_twin(case: Case) -> Case:
    """``case`` with its gates drawn in the case's dtype: the naive error there is what computing
    a gate gradient costs before it is stored in a coarser gate dtype (``budget_dtype``)."""
    return dataclasses.replace(case, draw=tuple(sorted({**dict(case.draw), "gate_dtype": case.dtype}.items())))


def budget_dtype(case: Case, name: str, value: torch.Tensor) -> str:
    """The dtype whose budget bounds output ``name``: the case's input dtype, or for a gradient
    returned in a coarser dtype than that (dg of bf16 gates with fp32 q, k, v) the coarser one,
    since storing the gradient rounds it to that dtype's precision."""
    coarser = value.dtype if value.is_floating_point() and value.dtype in DTYPE_NAMES else case.torch_dtype
    if name in card(case.op).outputs or torch.finfo(coarser).eps <= torch.finfo(case.torch_dtype).eps:
        return case.dtype
    return DTYPE_NAMES[coarser]


def bound_of(impl: registry.Implementation, case: Case, name: str, dtype: str, mode: str, *,
             grads: bool = True, budgets: budgets_mod.Budgets | None = None) -> Measurement:
    """The bound on output ``name`` of ``impl`` on ``case`` (dtype ``dtype``, mode ``mode``), with
    what it is made of, as a ``Measurement`` whose error is not yet known (0)."""
    budgets = budgets or budgets_mod.load()
    budget = budgets.get(case.op, name, dtype, mode, impl.name)
    naive_error, form = None, ""
    if budget.metric == "naive_ratio":
        naive_error, form = yardstick(case, name, budget.floor, grads=grads,
                                      outputs=cotangent_names(card(case.op), registry.provides(impl)))
    bound = budget.bound(naive_error) if naive_error is not None or budget.metric == "rel_rms" else budget.slack
    return Measurement(name, 0.0, bound, budget, naive_error, form, dtype)


def measure(impl: registry.Implementation, case: Case, out: dict[str, torch.Tensor],
            ref: dict[str, torch.Tensor], *, mode: str, grads: bool = True,
            budgets: budgets_mod.Budgets | None = None, knobs: dict | None = None) -> Verdict:
    """Measure ``out`` against ``ref`` under the budgets of ``impl`` on ``case`` in ``mode``.

    ``ref`` is the float64 truth (``verify``) or, for the laws that compare two evaluations of the
    same math (batch rows alone, a split run, another path), the other evaluation: the two may
    differ by no more than an implementation may differ from the truth. Every output and gradient
    in ``ref`` is measured (an output ``impl`` does not provide is left out); one missing from
    ``out`` is a problem, and so is an output ``ref`` does not have (a final state nobody asked for).
    A ``naive_ratio`` bound uses the naive implementation's error on ``case``, and where an output
    exceeds it, the Monte Carlo stage (``screened``), until one output fails after it: the verdict
    stands then, and the outputs after it keep their first-stage bounds.
    """
    op = card(case.op)
    budgets = budgets or budgets_mod.load()
    verdict = Verdict(case.op, impl.name, case, mode, dict(knobs or {}), record=impl)
    for name in op.outputs:
        if name in out and name not in ref:
            verdict.problems.append(f"{name}: returned, where the reference returns None on this case "
                                    f"(its options: {dict(case.options) or 'the defaults'})")
    for name in ref:
        if name in op.outputs and name not in registry.provides(impl):
            continue
        if name not in out:
            verdict.problems.append(f"{name}: not returned")
            continue
        want = output_dtype(case, name)
        if name in op.outputs and out[name].dtype != want:
            verdict.problems.append(f"{name}: dtype {out[name].dtype}, contract says {want}")
        limit = bound_of(impl, case, name, budget_dtype(case, name, out[name]), mode, grads=grads,
                         budgets=budgets)
        limit.error = rel_rms(out[name], ref[name], floor=limit.budget.floor)
        if limit.dtype != case.dtype:    # computed in the case's dtype, then stored coarser: both add
            limit.computing = bound_of(impl, computed_twin(case), name, case.dtype, mode, grads=grads, budgets=budgets)
            limit.bound += limit.computing.bound
        wrong = any(not m.passed for m in verdict.measurements)   # the verdict stands: no second stage needed
        if not limit.passed and limit.budget.metric == "naive_ratio" and not wrong:   # before calling it wrong
            second = screened(case, name, out[name], limit.error, mode, limit.budget.floor, grads=grads,
                              outputs=cotangent_names(op, registry.provides(impl)), budgets=budgets)
            if second is not None and second.bound > limit.bound:
                limit.monte_carlo = dataclasses.replace(second, first=limit.bound)
                limit.bound = second.bound
        verdict.measurements.append(limit)
    return verdict


def verify(impl: str | registry.Implementation, case: Case, *, mode: str | None = None, device: str = "cpu",
           grads: bool = True, budgets: budgets_mod.Budgets | None = None, **knobs) -> Verdict:
    """Measure one implementation on one case against the float64 truth and the budgets.

    ``mode`` selects the precision mode (passed as the ``precision`` knob where the implementation
    has it; budgets are looked up under it). Extra keyword arguments are the implementation's knobs.
    """
    impl = impl if isinstance(impl, registry.Implementation) else registry.resolve(impl, case.op)[0]
    mode = mode or impl.modes[0]
    if "precision" in impl.knobs:
        knobs = {"precision": mode, **knobs}
    grads = grads and impl.backward and impl.refused_backward(device, case) is None
    ref = truth(case, grads, cotangent_names(card(case.op), registry.provides(impl)))
    out = run(impl, case, device, grads, **knobs)
    return measure(impl, case, out, ref, mode=mode, grads=grads, budgets=budgets, knobs=knobs)
