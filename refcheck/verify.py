"""The pipeline: case -> implementation and float64 truth -> errors -> budgets -> verdict.

Every loop of refcheck (pytest laws, ``refcheck report``, ``drift record``, ``fuzz``) measures an
implementation through ``verify`` or its parts here, so an error is computed one way only.

For a case, the truth is the op's float64 reference on the same (already rounded) input values;
with gradients, both sides are differentiated against the same seeded upstream gradient (rounded
to the output's contract dtype), so ``dq`` of an implementation and ``dq`` of the truth answer the
same question.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from . import budgets as budgets_mod
from . import registry
from .case import DTYPES, Case
from .metrics import rel_rms
from .ops import Inputs, OpCard, card

CHUNKED_TRUTH_MIN_T = 256
"""From this sequence length on, the truth uses the float64 chunk form (equal to ~1e-12)."""


@dataclass
class Measurement:
    """One output's error against its budget."""

    output: str
    error: float
    bound: float
    budget: budgets_mod.Budget
    naive_error: float | None = None

    @property
    def passed(self) -> bool:
        return self.error <= self.bound

    @property
    def headroom(self) -> float:
        """bound / error: how many times the error could grow before failing (inf when exact)."""
        return math.inf if self.error == 0 else self.bound / self.error


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

    @property
    def passed(self) -> bool:
        return not self.problems and all(m.passed for m in self.measurements)

    def reproducer(self) -> str:
        knobs = "".join(f", {k}={v!r}" for k, v in self.knobs.items() if k != "precision")
        return (f"python -c \"from refcheck.verify import verify; from refcheck.case import Case; "
                f"print(verify({self.impl!r}, {self.case.to_python()}, mode={self.mode!r}{knobs}).table())\"")

    def table(self) -> str:
        head = f"{self.op} [{self.impl}] mode={self.mode} knobs={self.knobs}\n  case: {self.case.describe()}"
        rows = [f"  {m.output:<12} error {m.error:9.3e}  bound {m.bound:9.3e}  "
                f"{'ok  ' if m.passed else 'FAIL'}  ({m.budget.key}, {m.budget.metric})" for m in self.measurements]
        rows += [f"  problem: {p}" for p in self.problems]
        return "\n".join([head, *rows])

    def failure_message(self) -> str:
        return f"{self.table()}\n  reproduce: {self.reproducer()}"


def upstream_gradients(op: OpCard, case: Case, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Seeded random cotangents for the outputs, rounded to each output's contract dtype.

    ``o`` is in the input dtype, every other output (states, lse, gates) in float32. Entries where
    an output is not finite (lse of a row that sees no key) get a zero cotangent.
    """
    gen = torch.Generator().manual_seed(case.seed + 1)
    grads = {}
    for name in op.outputs:
        if name not in outputs:
            continue
        x = outputs[name]
        dtype = case.torch_dtype if name == "o" else torch.float32
        if dtype == DTYPES["fp8"]:
            dtype = torch.float32
        g = torch.randn(x.shape, generator=gen).to(dtype).to(x.device)
        grads[name] = torch.where(torch.isfinite(x.detach()), g, torch.zeros((), dtype=g.dtype, device=g.device))
    return grads


def evaluate(fn, op: OpCard, inputs: Inputs, *, grads: bool, cotangents=None, **knobs) -> dict[str, torch.Tensor]:
    """Run ``fn`` on ``inputs``; with ``grads``, backpropagate ``cotangents`` (or fresh ones from
    ``cotangents(outputs)``) and add each differentiable input's gradient as ``d<name>``."""
    leaves = {}
    if grads:
        def leaf(name, t):
            if name in op.differentiable and t.is_floating_point():
                leaves[name] = t.detach().clone().requires_grad_(True)
                return leaves[name]
            return t
        inputs = inputs.map(leaf)
    with torch.set_grad_enabled(grads):
        result = op.split(inputs.call(fn, **knobs))
    if grads:
        cts = cotangents(result) if callable(cotangents) else cotangents
        pairs = [(result[n], cts[n]) for n in cts if n in result and result[n].requires_grad]
        if pairs:
            torch.autograd.backward([p[0] for p in pairs], [p[1].to(p[0].dtype) for p in pairs])
        for name, t in leaves.items():
            if t.grad is not None:
                result[op.grad_name(name)] = t.grad
    return {n: t.detach() for n, t in result.items()}


@lru_cache(maxsize=256)
def truth(case: Case, device: str = "cpu", grads: bool = True) -> dict[str, torch.Tensor]:
    """The float64 reference outputs (and gradients) of a case; cached, since every implementation,
    mode and knob setting of a case shares it."""
    op = card(case.op)
    fn = op.chunked_reference if op.chunked_reference and case.dim.get("T", 0) >= CHUNKED_TRUTH_MIN_T else op.reference
    inputs = op.make_inputs(case, torch.device(device)).to_float64()
    return evaluate(fn, op, inputs, grads=grads, cotangents=lambda out: {
        n: g.to(torch.float64) for n, g in upstream_gradients(op, case, out).items()})


def run(impl: registry.Implementation, case: Case, device: str = "cpu", grads: bool = True,
        **knobs) -> dict[str, torch.Tensor]:
    """Outputs (and, if it has a backward, gradients) of an implementation on a case."""
    op = card(case.op)
    inputs = op.make_inputs(case, torch.device(device))
    return evaluate(impl.fn, op, inputs, grads=grads and impl.backward,
                    cotangents=lambda o: upstream_gradients(op, case, o), **knobs)


@lru_cache(maxsize=256)
def naive_outputs(case: Case, device: str = "cpu", grads: bool = True) -> dict[str, torch.Tensor]:
    """The naive implementation's results on a case: the yardstick of ``naive_ratio`` budgets."""
    return run(registry.get(case.op, "naive"), case, device, grads)


def verify(impl: str | registry.Implementation, case: Case, *, mode: str | None = None, device: str = "cpu",
           grads: bool = True, budgets: budgets_mod.Budgets | None = None, **knobs) -> Verdict:
    """Measure one implementation on one case against the float64 truth and the budgets.

    ``mode`` selects the precision mode (passed as the ``precision`` knob where the implementation
    has it; budgets are looked up under it). Extra keyword arguments are the implementation's knobs.
    """
    op = card(case.op)
    impl = impl if isinstance(impl, registry.Implementation) else registry.get(case.op, impl)
    budgets = budgets or budgets_mod.load()
    mode = mode or impl.modes[0]
    if "precision" in impl.knobs:
        knobs = {"precision": mode, **knobs}
    verdict = Verdict(case.op, impl.name, case, mode, dict(knobs))
    ref = truth(case, device, grads)
    out = run(impl, case, device, grads, **knobs)
    expected = [n for n in op.outputs if n in ref and n in impl.provides]
    if grads and impl.backward:
        expected += [n for n in ref if n not in op.outputs]
    for name in expected:
        if name not in out:
            verdict.problems.append(f"{name}: not returned")
            continue
        want = case.torch_dtype if name == "o" else torch.float32
        if name == "o" and want == DTYPES["fp8"]:
            want = torch.bfloat16
        if name in op.outputs and out[name].dtype != want:
            verdict.problems.append(f"{name}: dtype {out[name].dtype}, contract says {want}")
        budget = budgets.get(case.op, name, case.dtype, mode, impl.name)
        error = rel_rms(out[name], ref[name], floor=budget.floor)
        naive_error = None
        if budget.metric == "naive_ratio":
            naive = naive_outputs(case, device, grads)
            naive_error = rel_rms(naive[name], ref[name], floor=budget.floor) if name in naive else math.inf
        verdict.measurements.append(Measurement(name, error, budget.bound(naive_error), budget, naive_error))
    return verdict
