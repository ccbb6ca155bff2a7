"""Implementations of each op, by short name: ours (``triton``), the ``naive`` baseline, the peers.

An implementation is anything with the op's contract signature. Each record says where the
callable lives (imported lazily, so a missing peer costs nothing), which dtypes and devices it
supports, the keyword knobs it exposes (``precision`` is the precision mode of fp32 dots), whether it
has a backward, and which outputs it returns. ``availability`` says why it cannot run here instead
of failing: a peer that is not installed, or a kernel that needs a GPU, is unavailable, not broken.
A user's implementation joins with ``register("OP=module:callable")``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
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
    description: str = ""

    def __post_init__(self):
        if self.fixed_mode not in PRECISION_MODES:
            raise ValueError(f"fixed_mode: expected one of {PRECISION_MODES}, got {self.fixed_mode!r}")

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
    Implementation("kda", "fla", "refcheck.peers:fla_kda", devices=("cuda",), requires="fla",
                   fixed_mode="tf32", description="flash-linear-attention chunk_kda"),
    Implementation("gla", "fla", "refcheck.peers:fla_gla", devices=("cuda",), requires="fla",
                   fixed_mode="tf32", description="flash-linear-attention chunk_gla"),
    Implementation("simple_gla", "fla", "refcheck.peers:fla_simple_gla", devices=("cuda",), requires="fla",
                   fixed_mode="tf32", description="flash-linear-attention chunk_simple_gla"),
    Implementation("attention", "sdpa", "refcheck.peers:sdpa_attention", outputs=("o",),
                   description="torch scaled_dot_product_attention (no lse)"),
    Implementation("attention", "fa4", "refcheck.peers:fa4_attention", devices=("cuda",), dtypes=("bf16", "fp16"),
                   requires="flash_attn", description="flash-attn-4 (CUTLASS DSL)"),
) + tuple(
    Implementation(op, "naive", f"refcheck.naive:{op}", dtypes=OPS[op].dtypes if op != "attention" else ALL_DTYPES,
                   description="the reference evaluated in the input dtype")
    for op in OPS
)

_registry: dict[tuple[str, str], Implementation] = {(i.op, i.name): i for i in BUILTIN}


def register(spec: str) -> Implementation:
    """Add ``"OP=module:callable"`` (a user's implementation) for this run; returns its record."""
    op, sep, target = spec.partition("=")
    if not sep or ":" not in target:
        raise ValueError(f"implementation {spec!r}: expected OP=module:callable")
    card(op)
    impl = Implementation(op, target, target, description="given on the command line")
    _registry[(op, impl.name)] = impl
    return impl


def implementations(op: str | None = None) -> list[Implementation]:
    """Every registered implementation (of ``op``), in registration order."""
    return [i for i in _registry.values() if op is None or i.op == op]


def get(op: str, name: str) -> Implementation:
    try:
        return _registry[(op, name)]
    except KeyError:
        names = ", ".join(i.name for i in implementations(op))
        raise ValueError(f"no implementation {name!r} of {op}; registered: {names}") from None
