"""A case: everything needed to rebuild one set of inputs for an op, and nothing more.

A ``Case`` is small, printable and hashable: dimensions, dtypes, options and a seed. Hypothesis
draws cases (so shrinking works on shapes and options, not on tensor entries), the report and the
drift record list them in a fixed grid, and a failure prints one as its reproducer. The tensors are
made from it by the op card (``refcheck.model.ops``) with a seeded generator: same case, same bits.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8e4m3": torch.float8_e4m3fn,
    "fp8e5m2": torch.float8_e5m2,
}
"""Short dtype names used in budgets, cases and reports. No op card draws fp8 cases: the fp8 names key
the budgets of attention's fp8 forward (operands quantized per tensor, ``ops.attention.fp8_inputs``)."""

DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

PRECISION_MODES = ("ieee", "tf32", "tf32x3")
"""Precision of fp32 ``tl.dot``: plain fp32, tf32 (10-bit mantissa operands), 3-pass tf32."""


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a torch dtype (``torch.bfloat16 -> "bf16"``)."""
    return DTYPE_NAMES[dtype]


@dataclass(frozen=True)
class Case:
    """One reproducible input of an op.

    dims:     sizes by symbol (B, T, H, K, V for linear attention; B, T, S, H, Hk, Dqk, Dv for attention)
    dtype:    input dtype of the main tensors (short name)
    seed:     seeds every random tensor of the case
    seqlens:  packed sequence lengths (then B == 1 and T == sum), or None
    seqlens_k: key lengths of packed attention, or None
    options:  the op's non-tensor keyword arguments (scale, safe_gate, causal, ...)
    draw:     how inputs are drawn (gate dtype and distribution, initial state, cu_seqlens dtype)
    """

    op: str
    dims: tuple[tuple[str, int], ...]
    dtype: str
    seed: int
    seqlens: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None
    options: tuple[tuple[str, Any], ...] = ()
    draw: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def make(cls, op: str, dims: dict, dtype: str, seed: int, *, seqlens=None, seqlens_k=None,
             options: dict | None = None, draw: dict | None = None) -> Case:
        """Build a case from plain dicts (kept sorted, so equal cases compare and hash equal)."""
        return cls(op, tuple(sorted(dims.items())), dtype, int(seed),
                   None if seqlens is None else tuple(int(n) for n in seqlens),
                   None if seqlens_k is None else tuple(int(n) for n in seqlens_k),
                   tuple(sorted((options or {}).items())), tuple(sorted((draw or {}).items())))

    @property
    def dim(self) -> dict[str, int]:
        return dict(self.dims)

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def drawn(self) -> dict[str, Any]:
        return dict(self.draw)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def replace(self, **changes) -> Case:
        """A copy with some fields changed; dict-valued fields may be given as dicts."""
        for name in ("dims", "options", "draw"):
            if isinstance(changes.get(name), dict):
                changes[name] = tuple(sorted(changes[name].items()))
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line for tables and failure messages."""
        dims = ",".join(f"{k}={v}" for k, v in self.dims)
        parts = [self.op, self.dtype, dims]
        if self.seqlens is not None:
            parts.append(f"seqlens={list(self.seqlens)}")
        if self.seqlens_k is not None:
            parts.append(f"seqlens_k={list(self.seqlens_k)}")
        parts += [f"{k}={v}" for k, v in self.options if v not in (None, False)]
        parts += [f"{k}={v}" for k, v in self.draw]
        return " ".join(parts) + f" seed={self.seed}"

    def to_python(self) -> str:
        """A Python expression that rebuilds this case (for reproducers)."""
        fields = [f"{self.op!r}", repr(self.dim), repr(self.dtype), repr(self.seed)]
        if self.seqlens is not None:
            fields.append(f"seqlens={list(self.seqlens)!r}")
        if self.seqlens_k is not None:
            fields.append(f"seqlens_k={list(self.seqlens_k)!r}")
        if self.options:
            fields.append(f"options={self.opts!r}")
        if self.draw:
            fields.append(f"draw={self.drawn!r}")
        return f"Case.make({', '.join(fields)})"
