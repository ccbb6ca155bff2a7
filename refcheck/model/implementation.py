"""One implementation of one op: where its callable lives and what it states about itself.

A record of the model layer: op records (``refcheck.model.ops``) list their implementations with it, and
``refcheck.model.registry`` finds them by name. The callable is imported lazily, so a missing peer costs
nothing until it is asked for, and ``unavailable`` says why it cannot run here instead of failing.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import torch

from .case import PRECISION_MODES

ALL_DTYPES = ("fp32", "bf16", "fp16")


HEAD_DIM_NAMES = ("K", "V", "Dqk", "Dv")
"""The case dims that are head dimensions (what ``dim_multiple`` and ``min_dims`` restrict)."""


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
    head_dims: the only head dims it takes (a peer's compiled set, FlashInfer's 64/128/256), or None:
              cases for it are drawn with those, the grid's others are left out for it
    min_dims: by head dim name (K, V, Dqk, Dv), the smallest it runs at: a peer's limit that it
              neither states nor checks, found by refcheck and reported (the comment where it is set
              says where); cases for it are drawn at or above it, so that runs go on testing the rest
    head_first: it also takes ``head_first=True``: every input and output with a token axis laid out
              ``[B, H, T, ...]`` instead of ``[B, T, H, ...]`` (not packed); law ``head_first`` checks it
    declines: extensions of the op's contract it leaves out (``refcheck.model.ops.card.Extension``), beyond
              those whose keywords its signature lacks: for one without keywords (grouped value heads)
    isolated: it runs in a process of its own (``refcheck.runtime.candidate``), never in the judge's: ``fn``
              sends each call there (``refcheck verify``'s candidates)
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
    min_dims: Mapping[str, int] = field(default_factory=dict)
    head_dims: tuple[int, ...] | None = None
    backward_refusal: str | None = None
    forward_only_because: str | None = None
    head_first: bool = False
    declines: tuple[str, ...] = ()
    description: str = ""
    isolated: bool = False

    def __post_init__(self):
        if self.fixed_mode not in PRECISION_MODES:
            raise ValueError(f"fixed_mode: expected one of {PRECISION_MODES}, got {self.fixed_mode!r}")

    def __getstate__(self) -> dict:
        """Pickled without the imported callable (a worker process imports ``target`` itself: a
        callable reached through another name does not pickle)."""
        return {k: v for k, v in self.__dict__.items() if k != "fn"}

    @cached_property
    def fn(self) -> Callable:
        if self.isolated:
            from ..runtime import candidate
            return candidate.isolated(self.target, candidate.interpreted_here())
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def modes(self) -> tuple[str, ...]:
        """Precision modes it can be asked for; without the knob, its ``fixed_mode``."""
        return tuple(self.knobs.get("precision", (self.fixed_mode,)))

    def outside_dims(self, case) -> str | None:
        """Why ``case``'s head dims (K, V, Dqk, Dv) are outside what it declares (``dim_multiple``,
        ``min_dims``), or None: the grid leaves such a case out for it, as the strategies never draw one."""
        multiple = self.dim_multiple.get(case.dtype, 1)
        for name, d in case.dim.items():
            if name not in HEAD_DIM_NAMES:
                continue
            if self.head_dims is not None and d not in self.head_dims:
                return f"{name}={d}: it takes head dims {', '.join(map(str, self.head_dims))}"
            if d % multiple or d < self.min_dims.get(name, 1):
                return f"{name}={d}: its head dims are multiples of {multiple} from {self.min_dims.get(name, 1)}"
        return None

    def refused_backward(self, device: str, case=None) -> str | None:
        """Why its backward is refused on ``device`` (``case`` None) or on ``case`` there
        (``backward_refusal``), or None."""
        if not self.backward or self.backward_refusal is None:
            return None
        module, _, attr = self.backward_refusal.partition(":")
        return getattr(importlib.import_module(module), attr)(device, case)

    def on(self, device: str) -> Implementation:
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
            _ = self.fn
        except Exception as err:  # an uninstalled peer or a broken import: report, don't crash
            return f"cannot import {self.target}: {type(err).__name__}: {err}"
        return None
