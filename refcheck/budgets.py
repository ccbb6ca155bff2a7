"""Error budgets: the schema of ``tolerances.toml`` and its loader (the only reader of that file).

The file holds one table per op, output and input dtype::

    [kda.o.bf16]
    metric = "rel_rms"        # or "naive_ratio"
    ieee = 4e-3               # one bound per precision mode of the fp32 dots
    tf32 = 4e-3
    tf32x3 = 4e-3
    floor = 1e-6              # optional: RMS floor of the reference (default DEFAULT_FLOOR)
    slack = 0.0               # optional, naive_ratio only: bound = mode * naive_error + slack
    reason = "why this number: what was measured, on what"

and optionally per-implementation overrides as sub-tables (``[kda.o.bf16.naive]``) with the same
keys; an override replaces the whole entry for that implementation. With ``rel_rms`` the measured
relative RMS error must be at most the mode's number; with ``naive_ratio`` at most that many times
the error of the naive implementation (the reference evaluated in the input dtype) on the same case.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .case import DTYPES, PRECISION_MODES
from .metrics import METRICS

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "tolerances.toml"
DEFAULT_FLOOR = 1e-6
ENTRY_KEYS = {"metric", "reason", "floor", "slack", *PRECISION_MODES}


class BudgetError(ValueError):
    """A malformed tolerances file: says which file, which key and what is wrong."""


@dataclass(frozen=True)
class Budget:
    """The bound on one output of one op for one input dtype and precision mode."""

    key: str          # "kda.o.bf16" (+ ".impl" for an override)
    metric: str
    value: float      # the bound (rel_rms) or the factor (naive_ratio)
    floor: float
    slack: float
    reason: str

    def bound(self, naive_error: float | None = None) -> float:
        """The largest error that passes; ``naive_ratio`` needs the naive implementation's error."""
        if self.metric == "rel_rms":
            return self.value
        if naive_error is None:
            raise ValueError(f"{self.key}: naive_ratio needs the naive implementation's error")
        return self.value * naive_error + self.slack


@dataclass(frozen=True)
class Budgets:
    """All budgets of one file, looked up by op, output, dtype, mode and implementation."""

    path: Path
    entries: dict[tuple[str, str, str, str | None], dict]

    def get(self, op: str, output: str, dtype: str, mode: str, impl: str | None = None) -> Budget:
        entry = self.entries.get((op, output, dtype, impl)) or self.entries.get((op, output, dtype, None))
        if entry is None:
            raise KeyError(f"{self.path.name}: no budget for {op}.{output}.{dtype}")
        if mode not in PRECISION_MODES:
            raise KeyError(f"{self.path.name}: unknown precision mode {mode!r}")
        return Budget(entry["_key"], entry["metric"], float(entry[mode]), float(entry.get("floor", DEFAULT_FLOOR)),
                      float(entry.get("slack", 0.0)), entry["reason"])

    def has(self, op: str, output: str, dtype: str) -> bool:
        return (op, output, dtype, None) in self.entries

    def flat(self) -> dict[str, dict]:
        """Every entry by dotted key (``kda.o.bf16`` or ``kda.o.bf16.naive``), for diffs and reports."""
        return {e["_key"]: {k: v for k, v in e.items() if k != "_key"} for e in self.entries.values()}


def _check_entry(where: str, key: str, entry: dict) -> dict:
    def fail(what: str):
        raise BudgetError(f"{where}: [{key}] {what}")

    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        fail(f"unknown key(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
    metric = entry.get("metric")
    if metric not in METRICS:
        fail(f"bad metric name {metric!r}; expected one of {METRICS}")
    for mode in PRECISION_MODES:
        if mode not in entry:
            fail(f"missing mode {mode!r} (every entry gives {', '.join(PRECISION_MODES)})")
    for name in (*PRECISION_MODES, "floor", "slack"):
        if name not in entry:
            continue
        value = entry[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail(f"{name} must be a finite number, got {value!r}")
        if name == "slack" and value < 0 or name != "slack" and value <= 0:
            fail(f"{name} must be {'non-negative' if name == 'slack' else 'positive'}, got {value!r}")
    if "slack" in entry and metric != "naive_ratio":
        fail("slack applies to metric 'naive_ratio' only")
    reason = entry.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        fail("missing reason: every budget says why it is what it is")
    return {**entry, "_key": key}


def parse(text: str, where: str, ops: dict[str, tuple[str, ...]]) -> Budgets:
    """Validate the TOML ``text``; ``ops`` maps each op to the output names a budget may name."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise BudgetError(f"{where}: not valid TOML: {err}") from None
    entries = {}
    for op, outputs in data.items():
        if op not in ops:
            raise BudgetError(f"{where}: [{op}] unknown op; known ops: {', '.join(ops)}")
        if not isinstance(outputs, dict):
            raise BudgetError(f"{where}: [{op}] expected a table of outputs")
        for output, dtypes in outputs.items():
            if output not in ops[op]:
                raise BudgetError(f"{where}: [{op}.{output}] unknown output; {op} has {', '.join(ops[op])}")
            for dtype, entry in dtypes.items():
                key = f"{op}.{output}.{dtype}"
                if dtype not in DTYPES:
                    raise BudgetError(f"{where}: [{key}] unknown dtype; expected one of {', '.join(DTYPES)}")
                if not isinstance(entry, dict):
                    raise BudgetError(f"{where}: [{key}] expected a table")
                overrides = {k: v for k, v in entry.items() if isinstance(v, dict)}
                base = {k: v for k, v in entry.items() if not isinstance(v, dict)}
                entries[(op, output, dtype, None)] = _check_entry(where, key, base)
                for impl, sub in overrides.items():
                    entries[(op, output, dtype, impl)] = _check_entry(where, f"{key}.{impl}", sub)
    return Budgets(Path(where), entries)


@lru_cache(maxsize=None)
def _load_cached(path: str) -> Budgets:
    from .ops import OPS
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise BudgetError(f"{p}: cannot read: {err}") from None
    return parse(text, str(p), {name: card.budget_outputs for name, card in OPS.items()})


def load(path: str | Path | None = None) -> Budgets:
    """Load and validate a tolerances file (default: the repository's ``tolerances.toml``)."""
    return _load_cached(str(Path(path or DEFAULT_PATH).resolve()))
