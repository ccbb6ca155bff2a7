"""Op cards: one record per op with its contract, its float64 truth and how to build its inputs.

A newcomer who wants everything about an op starts at its card here: ``reference`` (the float64
recurrence), ``chunked_reference`` (the fast float64 chunk form), ``outputs`` and ``differentiable``
(which, with ``grad_name``, are the budget keys in ``tolerances.toml``) and ``make_inputs`` (how a
``Case`` becomes tensors). Implementations of the op are listed in ``refcheck.registry``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import references
from references.kda import l2norm

from .case import DTYPES, Case

GRAD_NAMES = {"initial_state": "dh0"}
"""Gradient output names are ``d`` + input name, except where listed here."""


@dataclass
class Inputs:
    """Tensors and options of one call of an op.

    tensors:    every tensor argument by name (positional ones and keyword ones such as cu_seqlens)
    positional: the names passed positionally, in order
    options:    non-tensor keyword arguments
    """

    tensors: dict[str, torch.Tensor]
    positional: tuple[str, ...]
    options: dict[str, object]

    def call(self, fn: Callable, **knobs):
        args = [self.tensors[n] for n in self.positional]
        kwargs = {n: t for n, t in self.tensors.items() if n not in self.positional}
        return fn(*args, **kwargs, **self.options, **knobs)

    def map(self, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> "Inputs":
        """A copy with every tensor replaced by ``fn(name, tensor)``."""
        return Inputs({n: fn(n, t) for n, t in self.tensors.items()}, self.positional, dict(self.options))

    def to_float64(self) -> "Inputs":
        """The same values in float64 (integer tensors such as cu_seqlens unchanged): the truth's input."""
        return self.map(lambda _, t: t.to(torch.float64) if t.is_floating_point() else t)


@dataclass(frozen=True)
class OpCard:
    """The contract of one op.

    outputs:        names of the returned values, in order (a single return value is one name)
    differentiable: tensor inputs that get a gradient when present
    make_inputs:    ``(case, device) -> Inputs``, deterministic in the case's seed
    natural_scales: by output name, ``(inputs, truth) -> float``: the size of what that output is a
                    difference of, used as the floor of its relative error (``natural_floor``)
    """

    name: str
    reference: Callable
    chunked_reference: Callable | None
    outputs: tuple[str, ...]
    differentiable: tuple[str, ...]
    make_inputs: Callable[[Case, torch.device], Inputs]
    dtypes: tuple[str, ...]
    natural_scales: Mapping[str, Callable[[Inputs, Mapping[str, torch.Tensor]], float]] = field(default_factory=dict)

    @staticmethod
    def grad_name(input_name: str) -> str:
        return GRAD_NAMES.get(input_name, "d" + input_name)

    @property
    def budget_outputs(self) -> tuple[str, ...]:
        """Every name a budget can be given for: outputs, then gradients."""
        return self.outputs + tuple(self.grad_name(n) for n in self.differentiable)

    def split(self, result) -> dict[str, torch.Tensor]:
        """Name the values an implementation returned; a ``None`` output is left out."""
        values = result if isinstance(result, tuple) else (result,)
        if len(values) != len(self.outputs):
            raise TypeError(f"{self.name}: expected {len(self.outputs)} return values "
                            f"{self.outputs}, got {len(values)}")
        return {n: v for n, v in zip(self.outputs, values) if v is not None}


# --- drawing values ------------------------------------------------------------------------------

def _normal(gen: torch.Generator, shape, device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device)


def _rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to ``dtype``: the values an implementation sees and the truth reproduces."""
    return x.to(dtype)


def draw_log_decay(gen: torch.Generator, shape, device, draw: dict) -> torch.Tensor:
    """Log-decays ``g <= 0``: ``logsigmoid(N(0,1)) / normalizer``, zeroed with probability
    ``mask_p``, a fraction ``spike_p`` of entries pushed to ``-U(0, spike)`` (very strong decay),
    and clamped to ``[lower_bound, 0]`` when ``clamp`` is given (safe_gate)."""
    g = F.logsigmoid(torch.randn(shape, generator=gen)) / float(draw.get("normalizer", 1.0))
    mask_p = float(draw.get("mask_p", 0.0))
    if mask_p:
        g = torch.where(torch.rand(shape, generator=gen) < mask_p, 0.0, g)
    spike_p = float(draw.get("spike_p", 0.0))
    if spike_p:
        spikes = -torch.rand(shape, generator=gen) * float(draw.get("spike", 1000.0))
        g = torch.where(torch.rand(shape, generator=gen) < spike_p, spikes, g)
    if draw.get("clamp") is not None:
        g = g.clamp(float(draw["clamp"]), 0.0)
    return g.to(device)


def _cu_seqlens(case: Case, lengths, device) -> torch.Tensor:
    dtype = torch.int32 if case.drawn.get("cu_dtype", "int32") == "int32" else torch.int64
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return torch.tensor(bounds, dtype=dtype, device=device)


def _linear_inputs(case: Case, device, *, gate_shape, with_beta: bool) -> tuple[dict, torch.Generator]:
    """q, k, v (and beta), gates, cu_seqlens and initial state shared by kda, gla and simple_gla."""
    d, drawn, opts = case.dim, case.drawn, case.opts
    gen = torch.Generator().manual_seed(case.seed)
    b, t, h, k, v = d["B"], d["T"], d["H"], d["K"], d["V"]
    dt = case.torch_dtype
    q = _normal(gen, (b, t, h, k), device)
    key = _normal(gen, (b, t, h, k), device)
    if with_beta and not opts.get("use_qk_l2norm"):
        key = l2norm(key.double()).float()   # the delta rule is stable for ||k|| <= 1
    else:
        key = key * k ** -0.5                                  # keep gla's state at a realistic scale
    tensors = {"q": _rounded(q, dt), "k": _rounded(key, dt), "v": _rounded(_normal(gen, (b, t, h, v), device), dt)}
    gate_dtype = DTYPES[drawn.get("gate_dtype", case.dtype)]
    if opts.get("use_gate_in_kernel"):
        g = _normal(gen, gate_shape(b, t, h, k), device)
    else:
        g = draw_log_decay(gen, gate_shape(b, t, h, k), device, drawn)
    tensors["g"] = _rounded(g, gate_dtype)
    if with_beta:
        tensors["beta"] = _rounded(torch.sigmoid(_normal(gen, (b, t, h), device)), dt)
    n = b
    if case.seqlens is not None:
        tensors["cu_seqlens"] = _cu_seqlens(case, case.seqlens, device)
        n = len(case.seqlens)
    if drawn.get("initial_state"):
        tensors["initial_state"] = _normal(gen, (n, h, k, v), device, 0.5)
    return tensors, gen


def kda_inputs(case: Case, device) -> Inputs:
    tensors, gen = _linear_inputs(case, device, gate_shape=lambda b, t, h, k: (b, t, h, k), with_beta=True)
    opts = dict(case.opts)
    if opts.get("use_gate_in_kernel"):
        h, k = case.dim["H"], case.dim["K"]
        tensors["A_log"] = (torch.rand(h, generator=gen) * 2.5).to(device)
        if case.drawn.get("dt_bias", True):
            tensors["dt_bias"] = _normal(gen, (h * k,), device, 0.5)
    return Inputs(tensors, ("q", "k", "v", "g", "beta"), opts)


def gla_inputs(case: Case, device) -> Inputs:
    tensors, _ = _linear_inputs(case, device, gate_shape=lambda b, t, h, k: (b, t, h, k), with_beta=False)
    return Inputs(tensors, ("q", "k", "v", "g"), case.opts)


def simple_gla_inputs(case: Case, device) -> Inputs:
    tensors, _ = _linear_inputs(case, device, gate_shape=lambda b, t, h, k: (b, t, h), with_beta=False)
    return Inputs(tensors, ("q", "k", "v", "g"), case.opts)


def kda_gate_inputs(case: Case, device) -> Inputs:
    d = case.dim
    gen = torch.Generator().manual_seed(case.seed)
    b, t, h, k = d["B"], d["T"], d["H"], d["K"]
    scale = float(case.drawn.get("input_scale", 1.0))
    tensors = {"g": _rounded(_normal(gen, (b, t, h, k), device, scale), case.torch_dtype),
               "A_log": (torch.rand(h, generator=gen) * 2.5).to(device)}
    if case.drawn.get("dt_bias", True):
        tensors["dt_bias"] = _normal(gen, (h * k,), device, 0.5)
    return Inputs(tensors, ("g", "A_log"), case.opts)


def attention_inputs(case: Case, device) -> Inputs:
    d = case.dim
    gen = torch.Generator().manual_seed(case.seed)
    b, t, s, h, hk, dqk, dv = (d[n] for n in ("B", "T", "S", "H", "Hk", "Dqk", "Dv"))
    dt = case.torch_dtype
    tensors = {"q": _rounded(_normal(gen, (b, t, h, dqk), device), dt),
               "k": _rounded(_normal(gen, (b, s, hk, dqk), device), dt),
               "v": _rounded(_normal(gen, (b, s, hk, dv), device), dt)}
    if case.seqlens is not None:
        tensors["cu_seqlens_q"] = _cu_seqlens(case, case.seqlens, device)
        tensors["cu_seqlens_k"] = _cu_seqlens(case, case.seqlens_k, device)
    return Inputs(tensors, ("q", "k", "v"), case.opts)


LINEAR_DTYPES = ("fp32", "bf16", "fp16")


def gate_gradient_scales(inputs: Inputs, truth: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """The natural size of the gradients that reach a log-decay gate: the gradient of the decay is
    a reverse cumulative sum over time of ``q * dq - k * dk`` (summed over channels for a scalar
    gate), exactly 0 where no state precedes the decay (T = 1 without an initial state), where a
    correct kernel that forms the difference returns its rounding residue. Its size is
    ``|q * dq| + |k * dk|`` (reduced to the decay's shape); carried back through KDA's in-kernel
    gate (``references.kda_gate``, whose partials keep one sign) it gives the size of ``dg``,
    ``dA_log`` and ``ddt_bias``. RMS of each, in float64, by gradient name ({} without dq, dk)."""
    if "dq" not in truth or "dk" not in truth:
        return {}
    t = inputs.tensors
    size = (t["q"].double() * truth["dq"].double()).abs() + (t["k"].double() * truth["dk"].double()).abs()
    while size.dim() > t["g"].dim():
        size = size.sum(-1)
    if not inputs.options.get("use_gate_in_kernel"):
        return {"dg": _rms(size)}
    leaves = {n: t[n].double().detach().requires_grad_() for n in ("g", "A_log", "dt_bias") if n in t}
    decay = references.kda_gate(leaves["g"], leaves["A_log"], leaves.get("dt_bias"), inputs.options.get("lower_bound"))
    grads = torch.autograd.grad(decay, list(leaves.values()), grad_outputs=size.to(decay.device))
    return {"d" + n: _rms(g) for n, g in zip(leaves, grads)}


def _rms(x: torch.Tensor) -> float:
    return float(x.double().square().mean().sqrt()) if x.numel() else 0.0


def _gate_gradient_scale(name: str) -> Callable[[Inputs, Mapping[str, torch.Tensor]], float]:
    """``OpCard.natural_scales`` entry of gate gradient ``name`` (``gate_gradient_scales``)."""
    return lambda inputs, truth: gate_gradient_scales(inputs, truth).get(name, 0.0)


GATE_GRADIENT_SCALES = {name: _gate_gradient_scale(name) for name in ("dg", "dA_log", "ddt_bias")}


OPS: dict[str, OpCard] = {card.name: card for card in (
    OpCard("kda_gate", references.kda_gate, None, ("gate",), ("g", "A_log", "dt_bias"),
           kda_gate_inputs, LINEAR_DTYPES),
    OpCard("kda", references.kda, references.kda_chunked, ("o", "final_state"),
           ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"), kda_inputs, LINEAR_DTYPES,
           GATE_GRADIENT_SCALES),
    OpCard("gla", references.gla, references.gla_chunked, ("o", "final_state"),
           ("q", "k", "v", "g", "initial_state"), gla_inputs, LINEAR_DTYPES, GATE_GRADIENT_SCALES),
    OpCard("simple_gla", references.simple_gla, references.simple_gla_chunked,
           ("o", "final_state"), ("q", "k", "v", "g", "initial_state"), simple_gla_inputs, LINEAR_DTYPES,
           GATE_GRADIENT_SCALES),
    OpCard("attention", references.attention, None, ("o", "lse"), ("q", "k", "v"), attention_inputs,
           LINEAR_DTYPES + ("fp8",)),
)}


def card(op: str) -> OpCard:
    """The card of ``op``; a clear error for an unknown name."""
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; known ops: {', '.join(OPS)}") from None
