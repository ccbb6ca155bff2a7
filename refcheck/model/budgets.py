"""Error budgets: the schema of ``tolerances.toml`` and its loader (the only reader of budget files).

Two kinds of budget (see ``docs/budgets.md``):

* the **contract bound**, a table per op, output and input dtype, judges every implementation
  (a user's kernel, a peer, ours where no guard is given)::

      [simple_gla.o.bf16]
      metric = "naive_ratio"   # bound = factor x the naive error on the case + slack
      ieee = 3                 # the factor, per precision mode of fp32 dots
      tf32 = 3
      tf32x3 = 3
      slack = 4e-3             # a number, or one per mode: { ieee = 1e-6, tf32 = 5e-3, tf32x3 = 1e-6 }
      reason = "what the number promises, in a line"
      measured = { worst = 0.9, draws = 400, of = "...", case = "..." }

  The naive error is that of the reference evaluated in the input dtype, in its recurrent form
  and, for ops with a chunk form, in its chunked form with the decays formed as kernels form them:
  the larger of the two (``refcheck.engine.verify.yardstick``). It scales with the case's conditioning,
  so a correct kernel passes whatever its rounding strategy, while a bug's error does not shrink.

* the **regression guard** of one implementation, a sub-table named after it
  (``[kda.o.bf16.triton]``): same keys, usually ``metric = "rel_rms"`` (the bound itself per
  mode), about 3x that implementation's measured worst. It replaces the contract bound for that
  implementation only.

Keys: ``metric`` (``rel_rms`` or ``naive_ratio``), one number per mode (``ieee``, ``tf32``,
``tf32x3``), ``floor`` (the RMS floor of the reference, default ``DEFAULT_FLOOR``), ``slack``
(``naive_ratio`` only), ``reason`` (one line: why) and ``measured`` (the measurement behind the
numbers, structured: ``worst``, ``draws``, ``of``, ``case``, ``before``). One key per line keeps a
pull request's diff to one short line per moved number.

One table is no op: ``[monte_carlo]`` sets the second stage of every ``naive_ratio`` bound, the
yardstick that does not depend on one evaluation order (``refcheck.engine.verify.monte_carlo_bound``)::

    [monte_carlo]
    samples = 8        # seeded Monte Carlo arithmetic evaluations of the reference, per form
    factor = 16        # bound = factor x their error + ulps x the stored dtype's eps
    ulps = 1
    reason = "..."

Budget files layer: the defaults shipped with refcheck first, then each ``--budgets FILE`` (or the
``REFCHECK_BUDGETS`` environment variable, paths joined by ``os.pathsep``) replaces or adds whole
entries. Every file is validated before any kernel runs; a bad one is a ``BudgetError`` naming
the file, the key and what is wrong.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .case import DTYPES, PRECISION_MODES
from .metrics import METRICS

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "tolerances.toml"
"""The defaults, shipped as package data (the repository's top-level ``tolerances.toml`` links here)."""
ENV = "REFCHECK_BUDGETS"
"""Budget files layered over the defaults (``os.pathsep``-separated): how worker processes and
reproducers see the ``--budgets`` of the command that started them."""
DEFAULT_FLOOR = 1e-6
ENTRY_KEYS = {"metric", "reason", "floor", "slack", "measured", *PRECISION_MODES}
MEASURED_KEYS: dict[str, type | tuple[type, ...]] = {"worst": (int, float), "draws": int, "of": str, "case": str,
                                                     "before": (int, float)}
"""Fields of ``measured``: the worst error (rel_rms) or ratio (naive_ratio) measured, over how many
draws, of what (implementations, strategy), the worst case, and the number before a change."""


MONTE_CARLO = "monte_carlo"
"""The table of ``MonteCarlo``'s settings (no op has this name)."""
MONTE_CARLO_KEYS: dict[str, type | tuple[type, ...]] = {"samples": int, "factor": (int, float), "ulps": (int, float),
                                                        "reason": str, "measured": dict}


@dataclass(frozen=True)
class MonteCarlo:
    """The second stage of a ``naive_ratio`` bound: ``factor`` x the Monte Carlo error of the reference
    on the case (``samples`` evaluations per form) + ``ulps`` x the eps of the output's stored dtype."""

    samples: int
    factor: float
    ulps: float
    reason: str


class BudgetError(ValueError):
    """A malformed budgets file: says which file, which key and what is wrong."""


@dataclass(frozen=True)
class Budget:
    """The bound on one output of one op for one input dtype and precision mode."""

    key: str          # "kda.o.bf16" (+ ".impl" for a regression guard)
    metric: str
    value: float      # the bound (rel_rms) or the factor (naive_ratio)
    floor: float
    slack: float
    reason: str
    source: str = ""  # the file the entry came from (named in ``explain`` unless the defaults)

    @property
    def guard(self) -> bool:
        """A regression guard of one implementation (an override), not the contract bound."""
        return self.key.count(".") > 2

    def bound(self, naive_error: float | None = None) -> float:
        """The largest error that passes; ``naive_ratio`` needs the naive error on the case."""
        if self.metric == "rel_rms":
            return self.value
        if naive_error is None:
            raise ValueError(f"{self.key}: naive_ratio needs the naive implementation's error")
        return self.value * naive_error + self.slack

    def explain(self, naive_error: float | None = None, naive_form: str = "", dtype: str = "") -> str:
        """What the bound is made of, in words: ``3 x the bf16 naive error on this case (chunked form),
        4.5e-02, + 1e-05 [simple_gla.o.bf16]``."""
        layer = "" if self.source == str(DEFAULT_PATH) else f", {Path(self.source).name}"
        where = f"[{self.key}{' guard' if self.guard else ''}{layer}]"
        if self.metric == "rel_rms":
            return f"fixed {self.value:.2g} {where}"
        form = f" ({naive_form} form)" if naive_form else ""
        naive = "no finite naive error" if naive_error is None or not math.isfinite(naive_error) else f"{naive_error:.1e}"
        return f"{self.value:g} x the {dtype} naive error on this case{form}, {naive}, + {self.slack:.0e} {where}"


@dataclass(frozen=True)
class Budgets:
    """All budgets of the layered files, looked up by op, output, dtype, mode and implementation."""

    paths: tuple[Path, ...]
    entries: dict[tuple[str, str, str, str | None], dict]
    monte_carlo: MonteCarlo | None = None   # None: the file sets none (the defaults always do)

    def entry(self, op: str, output: str, dtype: str, impl: str | None = None) -> dict:
        entry = self.entries.get((op, output, dtype, impl)) or self.entries.get((op, output, dtype, None))
        if entry is None:
            raise KeyError(f"{', '.join(p.name for p in self.paths)}: no budget for {op}.{output}.{dtype}")
        return entry

    def get(self, op: str, output: str, dtype: str, mode: str, impl: str | None = None) -> Budget:
        entry = self.entry(op, output, dtype, impl)
        if mode not in PRECISION_MODES:
            raise KeyError(f"unknown precision mode {mode!r}")
        slack = entry.get("slack", 0.0)
        slack = slack[mode] if isinstance(slack, dict) else slack
        return Budget(entry["_key"], entry["metric"], float(entry[mode]), float(entry.get("floor", DEFAULT_FLOOR)),
                      float(slack), entry["reason"], entry["_source"])

    def has(self, op: str, output: str, dtype: str) -> bool:
        return (op, output, dtype, None) in self.entries

    def flat(self) -> dict[str, dict]:
        """Every entry by dotted key (``kda.o.bf16`` or ``kda.o.bf16.triton``), for diffs and reports."""
        return {e["_key"]: {k: v for k, v in e.items() if not k.startswith("_")} for e in self.entries.values()}


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _check_entry(where: str, key: str, entry: dict) -> dict:
    def fail(what: str):
        raise BudgetError(f"{where}: [{key}] {what}")

    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        fail(f"unknown key(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)} "
             "(a sub-table is the guard of an implementation)")
    metric = entry.get("metric")
    if metric not in METRICS:
        fail(f"bad metric name {metric!r}; expected one of {METRICS}")
    for mode in PRECISION_MODES:
        if mode not in entry:
            fail(f"missing mode {mode!r} (every entry gives {', '.join(PRECISION_MODES)})")
    for name in (*PRECISION_MODES, "floor"):
        if name in entry:
            value = entry[name]
            if not _number(value):
                fail(f"{name} must be a finite number, got {value!r}")
            if value <= 0:
                fail(f"{name} must be positive, got {value!r}")
    if "slack" in entry:
        if metric != "naive_ratio":
            fail("slack applies to metric 'naive_ratio' only")
        slack = entry["slack"]
        values = slack if isinstance(slack, dict) else {"slack": slack}
        if isinstance(slack, dict) and set(slack) != set(PRECISION_MODES):
            fail(f"slack: a table gives exactly the modes {', '.join(PRECISION_MODES)}, got {sorted(slack)}")
        for mode, value in values.items():
            if not _number(value) or value < 0:
                fail(f"slack{'' if mode == 'slack' else '.' + mode} must be a non-negative number, got {value!r}")
    reason = entry.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        fail("missing reason: every budget says why it is what it is")
    measured = entry.get("measured", {})
    if not isinstance(measured, dict):
        fail(f"measured must be a table of {sorted(MEASURED_KEYS)}, got {measured!r}")
    for name, value in measured.items():
        if name not in MEASURED_KEYS:
            fail(f"measured: unknown field {name!r}; allowed: {sorted(MEASURED_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, MEASURED_KEYS[name]):
            fail(f"measured.{name}: wrong type {type(value).__name__}")
    return {**entry, "_key": key, "_source": where}


def parse(text: str, where: str, ops: dict[str, tuple[str, ...]]) -> Budgets:
    """Validate the TOML ``text``; ``ops`` maps each op to the output names a budget may name."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise BudgetError(f"{where}: not valid TOML: {err}") from None
    entries: dict[tuple[str, str, str, str | None], dict] = {}
    monte_carlo = _monte_carlo(where, data.pop(MONTE_CARLO)) if MONTE_CARLO in data else None
    for op, outputs in data.items():
        if op not in ops:
            raise BudgetError(f"{where}: [{op}] unknown op; known ops: {', '.join(ops)}")
        if not isinstance(outputs, dict):
            raise BudgetError(f"{where}: [{op}] expected a table of outputs")
        for output, dtypes in outputs.items():
            if output not in ops[op]:
                raise BudgetError(f"{where}: [{op}.{output}] unknown output; {op} has {', '.join(ops[op])}")
            if not isinstance(dtypes, dict):
                raise BudgetError(f"{where}: [{op}.{output}] expected a table of dtypes")
            for dtype, entry in dtypes.items():
                key = f"{op}.{output}.{dtype}"
                if dtype not in DTYPES:
                    raise BudgetError(f"{where}: [{key}] unknown dtype; expected one of {', '.join(DTYPES)}")
                if not isinstance(entry, dict):
                    raise BudgetError(f"{where}: [{key}] expected a table")
                guards = {k: v for k, v in entry.items() if isinstance(v, dict) and k not in ("measured", "slack")}
                base = {k: v for k, v in entry.items() if k not in guards}
                if base:
                    entries[(op, output, dtype, None)] = _check_entry(where, key, base)
                for impl, sub in guards.items():
                    entries[(op, output, dtype, impl)] = _check_entry(where, f"{key}.{impl}", sub)
    return Budgets((Path(where),), entries, monte_carlo)


def _monte_carlo(where: str, table) -> MonteCarlo:
    """The ``[monte_carlo]`` table, validated: positive numbers, a whole number of samples, a reason."""
    if not isinstance(table, dict):
        raise BudgetError(f"{where}: [{MONTE_CARLO}] expected a table")
    unknown = set(table) - set(MONTE_CARLO_KEYS)
    if unknown:
        raise BudgetError(f"{where}: [{MONTE_CARLO}] unknown key(s) {sorted(unknown)}; allowed: {sorted(MONTE_CARLO_KEYS)}")
    for name, kind in MONTE_CARLO_KEYS.items():
        value = table.get(name)
        if name in ("samples", "factor", "ulps", "reason") and value is None:
            raise BudgetError(f"{where}: [{MONTE_CARLO}] missing {name}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise BudgetError(f"{where}: [{MONTE_CARLO}] {name}: wrong type {type(value).__name__}")
    if table["samples"] < 2:
        raise BudgetError(f"{where}: [{MONTE_CARLO}] samples must be at least 2, got {table['samples']}")
    for name in ("factor", "ulps"):
        if not _number(table[name]) or table[name] <= 0:
            raise BudgetError(f"{where}: [{MONTE_CARLO}] {name} must be a positive number, got {table[name]!r}")
    if not table["reason"].strip():
        raise BudgetError(f"{where}: [{MONTE_CARLO}] missing reason")
    return MonteCarlo(table["samples"], float(table["factor"]), float(table["ulps"]), table["reason"])


def _outputs() -> dict[str, tuple[str, ...]]:
    from .ops import OPS
    return {name: card.budget_outputs for name, card in OPS.items()}


def _read(path: Path) -> Budgets:
    try:
        text = path.read_text()
    except OSError as err:
        raise BudgetError(f"{path}: cannot read: {err}") from None
    return parse(text, str(path), _outputs())


def check_complete(budgets: Budgets) -> None:
    """Every output of every op has a contract bound for every dtype of the op."""
    from .ops import OPS
    missing = [f"{op}.{output}.{dtype}" for op, card in OPS.items() for output in card.budget_outputs
               for dtype in card.dtypes if not budgets.has(op, output, dtype)]
    if missing:
        raise BudgetError(f"{budgets.paths[0]}: no contract bound for {', '.join(missing)}")


@cache
def _layered(paths: tuple[str, ...]) -> Budgets:
    layers = [_read(Path(p)) for p in paths]
    entries: dict = {}
    monte_carlo = None
    for layer in layers:
        entries.update(layer.entries)
        monte_carlo = layer.monte_carlo or monte_carlo
    merged = Budgets(tuple(Path(p) for p in paths), entries, monte_carlo)
    check_complete(merged)
    if monte_carlo is None:
        raise BudgetError(f"{merged.paths[0]}: no [{MONTE_CARLO}] table (the second stage of every naive_ratio bound)")
    return merged


def user_paths() -> tuple[str, ...]:
    """The layered files of this process (``REFCHECK_BUDGETS``), absolute."""
    return tuple(str(Path(p).resolve()) for p in os.environ.get(ENV, "").split(os.pathsep) if p)


def use(paths) -> Budgets:
    """Layer ``paths`` over the defaults for this process and the processes it starts (sets
    ``REFCHECK_BUDGETS``), validating every file now; returns the merged budgets."""
    resolved = [str(Path(p).resolve()) for p in paths or ()]
    for p in resolved:
        if not Path(p).is_file():
            raise BudgetError(f"--budgets {p}: no such file")
    if resolved:
        os.environ[ENV] = os.pathsep.join(resolved)
    else:
        os.environ.pop(ENV, None)
    return load()


def load() -> Budgets:
    """The budgets in force: the defaults with the ``REFCHECK_BUDGETS`` files layered over them."""
    return _layered((str(DEFAULT_PATH), *user_paths()))
