"""``refcheck budgets diff [REV_A] [REV_B]``: every budget a change loosened, tightened, added or removed.

Both sides of ``tolerances.toml`` are read with ``git show REV:tolerances.toml`` (or from the working
tree) and validated by the one budgets parser (``refcheck.model.budgets.parse``). Entries are matched by
dotted key (``kda.o.bf16``, ``kda.o.bf16.triton`` for an override); within an entry, each precision
mode's number, ``floor`` and ``slack`` is compared: a larger number lets a larger error pass
(a larger floor shrinks the measured relative error of a near-zero reference), so it is a
loosening. A changed ``metric`` cannot be ordered and is listed with the loosenings, to be read.

    refcheck budgets diff               HEAD -> working tree
    refcheck budgets diff main          main -> working tree
    refcheck budgets diff main HEAD     main -> HEAD
"""
from __future__ import annotations

import argparse
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..model.budgets import DEFAULT_FLOOR, BudgetError, Budgets, parse
from ..model.case import PRECISION_MODES
from .cli import UsageError

FILE = "refcheck/tolerances.toml"
OLD_FILE = "tolerances.toml"
"""Where the defaults lived before they shipped as package data (read for older revisions)."""
KINDS = ("loosened", "tightened", "added", "removed")
DEFAULTS = {"floor": DEFAULT_FLOOR, "slack": 0.0}


@dataclass
class Change:
    """One budget entry that differs; ``fields`` lists ``(name, before, after)`` of the moved numbers."""

    kind: str
    key: str
    before: dict | None
    after: dict | None
    fields: list[tuple[str, object, object]] = field(default_factory=list)

    @property
    def reason(self) -> str:
        entry = self.after or self.before
        assert entry is not None    # a change has a before, an after or both
        return entry["reason"]

    @property
    def old_reason(self) -> str | None:
        """The base reason when the reason text changed too."""
        if self.before and self.after and self.before["reason"] != self.after["reason"]:
            return self.before["reason"]
        return None


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except OSError as err:
        raise UsageError(f"cannot run git: {err}") from None


def read(repo: Path, rev: str | None, path: str = FILE) -> tuple[str, str]:
    """The text of ``path`` (relative to the repository's top folder) at git revision ``rev`` of
    ``repo``, or in the working tree for ``None``; and a name for messages."""
    if rev is None:
        top = _git(repo, "rev-parse", "--show-toplevel")
        target = (Path(top.stdout.strip()) if top.returncode == 0 else repo) / path
        try:
            return target.read_text(), f"{target} (working tree)"
        except OSError as err:
            raise UsageError(f"cannot read {target}: {err}") from None
    done = _git(repo, "show", f"{rev}:{path}")
    if done.returncode != 0 and path == FILE:
        old = _git(repo, "show", f"{rev}:{OLD_FILE}")
        done, path = (old, OLD_FILE) if old.returncode == 0 else (done, path)
    if done.returncode != 0:
        raise UsageError(f"git show {rev}:{path} failed in {repo}: {done.stderr.strip()}")
    return done.stdout, f"{path} at {rev}"


def load_side(repo: Path, rev: str | None, path: str = FILE) -> Budgets:
    """Read and validate one side (a malformed file is a usage error naming the side)."""
    from ..model.ops import OPS

    text, where = read(repo, rev, path)
    try:
        return parse(text, where, {name: card.budget_outputs for name, card in OPS.items()})
    except BudgetError as err:
        raise UsageError(str(err)) from None


def _field(entry: dict, name: str):
    """A number of an entry by name (``slack.tf32``: the slack of one mode, a plain slack being the
    same for every mode), or its default."""
    if name.startswith("slack."):
        slack = entry.get("slack", DEFAULTS["slack"])
        return slack[name.partition(".")[2]] if isinstance(slack, dict) else slack
    return entry.get(name, DEFAULTS.get(name))


def diff(before: Budgets, after: Budgets) -> list[Change]:
    """Every differing entry, loosened first, then tightened, added, removed (each sorted by key).
    An entry loosened in one mode and tightened in another appears under both with its fields."""
    a, b = before.flat(), after.flat()
    changes = []
    for key in sorted(set(a) & set(b)):
        old, new = a[key], b[key]
        numbers = [(name, _field(old, name), _field(new, name))
                   for name in (*PRECISION_MODES, "floor", *(f"slack.{m}" for m in PRECISION_MODES))]
        numbers = [(name, x, y) for name, x, y in numbers if x != y]
        if old["metric"] != new["metric"]:   # numbers of different metrics do not order
            changes.append(Change("loosened", key, old, new, [("metric", old["metric"], new["metric"]), *numbers]))
            continue
        for kind, looser in (("loosened", True), ("tightened", False)):
            fields = [(name, x, y) for name, x, y in numbers if (y > x) == looser]
            if fields:
                changes.append(Change(kind, key, old, new, fields))
    changes += [Change("added", key, None, b[key]) for key in sorted(set(b) - set(a))]
    changes += [Change("removed", key, a[key], None) for key in sorted(set(a) - set(b))]
    return sorted(changes, key=lambda c: KINDS.index(c.kind))


# --- rendering -------------------------------------------------------------------------------------

def _number(x) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else str(x)


def describe_fields(c: Change) -> str:
    """``ieee 0.001 -> 0.003 (x3)`` for moved numbers; every number for an added or removed entry."""
    if c.fields:
        parts = []
        for name, x, y in c.fields:
            ratio = f" (x{y / x:.3g})" if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else ""
            parts.append(f"{name} {_number(x)} -> {_number(y)}{ratio}")
        return ", ".join(parts)
    entry = c.after or c.before
    assert entry is not None    # a change has a before, an after or both
    return ", ".join(f"{k} {_number(entry[k])}" for k in ("metric", *PRECISION_MODES, "floor", "slack") if k in entry)


def text(changes: list[Change], title: str) -> str:
    lines = [title]
    if not changes:
        return "\n".join(lines + ["no budget changed"])
    for kind in KINDS:
        group = [c for c in changes if c.kind == kind]
        if not group:
            continue
        lines.append(f"{kind} ({len(group)}):")
        for c in group:
            lines.append(f"  {c.key}: {describe_fields(c)}")
            lines.append(f"      reason: {c.reason}")
            if c.old_reason:
                lines.append(f"      was:    {c.old_reason}")
    return "\n".join(lines)


def markdown(changes: list[Change], title: str) -> str:
    lines = [f"### {title}", ""]
    if not changes:
        return "\n".join(lines + ["No budget changed."])
    for kind in KINDS:
        group = [c for c in changes if c.kind == kind]
        if not group:
            continue
        mark = " :warning:" if kind == "loosened" else ""
        lines += [f"#### {kind} ({len(group)}){mark}", "", "| budget | change | reason |", "|---|---|---|"]
        for c in group:
            reason = c.reason + (f" (was: {c.old_reason})" if c.old_reason else "")
            cells = [f"`{c.key}`", describe_fields(c), reason]
            lines.append("| " + " | ".join(s.replace("|", "\\|").replace("\n", " ") for s in cells) + " |")
        lines.append("")
    return "\n".join(lines)


# --- command line ----------------------------------------------------------------------------------

def add_parser(subparsers) -> None:
    p = subparsers.add_parser("budgets", help="tolerances.toml between git revisions")
    sub = p.add_subparsers(dest="budgets_command", required=True)
    d = sub.add_parser("diff", help="budgets loosened, tightened, added or removed between two revisions",
                       description=__doc__.split("\n\n")[-1], formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("rev_a", nargs="?", default="HEAD", help="base revision (default: HEAD)")
    d.add_argument("rev_b", nargs="?", default=None, help="head revision (default: the working tree)")
    d.add_argument("--repo", type=Path, default=Path("."), help="the git repository (default: the current folder)")
    d.add_argument("--file", default=FILE, help=f"path of the budgets file in the repository (default: {FILE})")
    d.add_argument("--markdown", action="store_true", help="print Markdown for a pull request comment")
    d.add_argument("--fail-on-loosened", action="store_true", help="exit 1 when a budget was loosened")
    d.set_defaults(run=run_diff)


def run_diff(args) -> int:
    before = load_side(args.repo, args.rev_a, args.file)
    after = load_side(args.repo, args.rev_b, args.file)
    changes = diff(before, after)
    title = f"budgets diff: {args.file} {args.rev_a} -> {args.rev_b or 'working tree'}"
    print(markdown(changes, title) if args.markdown else text(changes, title))
    loosened = any(c.kind == "loosened" for c in changes)
    return 1 if loosened and args.fail_on_loosened else 0
