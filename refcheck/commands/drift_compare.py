"""Compare two drift records (``refcheck drift compare``): what a change did to every error.

Rows are (point, output) pairs, matched by the point id ``op/impl/dtype/mode/label``. With
``ratio = max(head, EPS) / max(base, EPS)`` and the head's bound ``b``, a row's status is, in order:

    broken           the head point raised or broke its contract (dtype, missing output), the base did not
    over budget      head error > b, base error was within its bound
    regressed        ratio > threshold, or an output no longer returned
    gone             measured in base, missing in head (its implementation stopped running)
    still failing    over its bound, or broken, in both, not worse past the threshold (not a change of
                     this pull request, but listed with the regressions)
    improved         ratio < 1 / threshold (or the base was broken / over budget and the head is fine)
    changed          any other ratio != 1
    unchanged        the same error
    new              only in head

The first four are regressions: ``compare`` exits non-zero when there is one. A bound that moved
(a tolerances.toml change, or the naive error behind a ``naive_ratio`` bound) is shown beside the row.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

DEFAULT_THRESHOLD = 1.25
"""An error that grows by more than 25% is a regression: the grid's errors are RMS over hundreds of
elements and the records are deterministic, so a same-algorithm change moves them by a few percent;
tf32 where tf32x3 was moves them by ~1000x."""

EPS = 1e-12
"""Errors below this count as this much in ratios (an exact result has error 0)."""

REGRESSIONS = ("broken", "over budget", "regressed", "gone")
ORDER = REGRESSIONS + ("still failing", "improved", "changed", "unchanged", "new")


@dataclass
class Row:
    """One output of one point in base and head (``None`` where a side lacks it)."""

    point: dict                  # the head point (the base one for "gone")
    output: str                  # "*" for a whole point (broken, gone, new without outputs)
    base: dict | None
    head: dict | None
    status: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.base is None or self.head is None:
            return None
        b, h = self.base["error"], self.head["error"]
        return 1.0 if b == h else max(h, EPS) / max(b, EPS)

    @property
    def headroom(self) -> float | None:
        """head bound / head error: how far the head error may still grow."""
        if self.head is None:
            return None
        e, b = self.head["error"], self.head["bound"]
        return math.inf if e == 0 else b / e

    @property
    def bound_moved(self) -> bool:
        return self.base is not None and self.head is not None and self.base["bound"] != self.head["bound"]


@dataclass
class Comparison:
    base: dict
    head: dict
    threshold: float
    rows: list[Row] = field(default_factory=list)

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.status in REGRESSIONS]

    def by_status(self, *statuses: str) -> list[Row]:
        return [r for r in self.rows if r.status in statuses]

    def counts(self) -> dict[str, int]:
        counts = {s: 0 for s in ORDER}
        for r in self.rows:
            counts[r.status] += 1
        return {s: n for s, n in counts.items() if n}


def _over(m: dict | None) -> bool:
    return m is not None and not m["error"] <= m["bound"]


def _broken(p: dict | None) -> str | None:
    """Why a point did not measure cleanly (a crash or contract problems), or None."""
    if p is None:
        return None
    if p.get("crash"):
        return p["crash"]
    return "; ".join(p["problems"]) or None


def _classify(row: Row, threshold: float) -> None:
    base, head = row.base, row.head
    if base is None:
        row.status = "new"
        return
    if head is None:
        row.status, row.note = "regressed", "no longer returned"
        return
    ratio = row.ratio
    assert ratio is not None    # both sides are present
    if _over(head) and not _over(base):
        row.status = "over budget"
    elif not ratio <= threshold:
        row.status = "regressed"
    elif _over(head):
        row.status = "still failing"
    elif _over(base) or ratio < 1 / threshold:
        row.status = "improved"
    else:
        row.status = "unchanged" if base["error"] == head["error"] else "changed"


def _point_rows(bp: dict | None, hp: dict | None, threshold: float, why_gone: str) -> list[Row]:
    """The rows of one point id: one per output, or one for the whole point (gone, broken)."""
    if hp is None:
        assert bp is not None   # a point id comes from one of the two records
        return [Row(bp, "*", None, None, "gone", why_gone)]
    broken_head, broken_base = _broken(hp), _broken(bp)
    if bp is not None and broken_head and not broken_base:
        return [Row(hp, "*", None, None, "broken", broken_head)]
    base_out = bp["outputs"] if bp is not None else {}
    names = list(base_out) + [n for n in hp["outputs"] if n not in base_out]
    if not names:   # nothing measured on either side
        status = "new" if bp is None else "still failing" if broken_head else "unchanged"
        return [Row(hp, "*", None, None, status, broken_head or "")]
    rows = []
    for name in names:
        row = Row(hp, name, base_out.get(name), hp["outputs"].get(name))
        _classify(row, threshold)
        if bp is not None and broken_base and not broken_head:
            row.status, row.note = "improved", f"base: {broken_base}"
        rows.append(row)
    return rows


def compare(base: dict, head: dict, threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Every (point, output) of two comparable records (``drift.check_comparable``), classified and
    sorted: regressions first (largest ratio first within a status)."""
    base_points = {p["id"]: p for p in base["points"]}
    head_points = {p["id"]: p for p in head["points"]}
    why_gone = {(u["op"], u["impl"]): u["why"] for u in head["unavailable"]}
    rows = []
    for pid in list(base_points) + [i for i in head_points if i not in base_points]:
        bp, hp = base_points.get(pid), head_points.get(pid)
        gone = "" if bp is None else why_gone.get((bp["op"], bp["impl"]), "not in the head record")
        rows += _point_rows(bp, hp, threshold, gone)
    rank = {s: i for i, s in enumerate(ORDER)}
    rows.sort(key=lambda r: (rank[r.status], -r.ratio if r.ratio is not None else 0.0))
    return Comparison(base, head, threshold, rows)


# --- rendering -------------------------------------------------------------------------------------

def fmt_error(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}" if math.isfinite(x) else str(x)


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x" if math.isfinite(x) else "inf"


def _cells(r: Row) -> list[str]:
    p = r.point
    bound = fmt_error(r.head["bound"]) if r.head else "-"
    if r.bound_moved:
        assert r.base is not None   # bound_moved implies both sides
        bound += f" (was {fmt_error(r.base['bound'])})"
    return [r.status, f"{p['op']} [{p['impl']}] {p['dtype']} {p['mode']} {p['label']}", r.output,
            fmt_error(r.base["error"] if r.base else None), fmt_error(r.head["error"] if r.head else None),
            fmt_ratio(r.ratio), bound, fmt_ratio(r.headroom), r.note]


COLUMNS = ("status", "point (op [impl] dtype mode case)", "output", "base error", "head error", "ratio",
           "bound", "headroom", "note")
MAX_MARKDOWN_ROWS = 60


def _columns(rows: list[Row]) -> tuple[str, ...]:
    """The table's columns: the last one (note) only when a row has a note."""
    return COLUMNS if any(r.note for r in rows) else COLUMNS[:-1]


def _header(c: Comparison) -> list[str]:
    eb, eh = c.base["environment"], c.head["environment"]

    def rev(env):
        r = env.get("git_revision") or "unknown"
        return r[:10] + ("+dirty" if env.get("git_dirty") else "")

    lines = [f"base {rev(eb)} ({c.base['path']}) -> head {rev(eh)} ({c.head['path']})",
             f"device {eh['device']} {eh.get('device_name', '')}{' (Triton interpreted)' if eh['interpreted'] else ''}"
             f", grid {c.head['grid']['hash'][:12]}{' (quick)' if c.head['grid'].get('quick') else ''}"
             f", threshold {c.threshold:g}x"]
    changed = [f"{k} {eb.get(k)} -> {eh.get(k)}" for k in ("device_name", "python", "torch", "triton", "refcheck")
               if eb.get(k) != eh.get(k)]
    if changed:
        lines.append("environment changed: " + ", ".join(changed))
    return lines


def _unavailable(c: Comparison) -> list[str]:
    """The implementations that did not run: once when both sides skipped them for the same reason."""
    base, head = ([(u["op"], u["impl"], u["why"]) for u in rec["unavailable"]] for rec in (c.base, c.head))
    return ([f"{op} [{impl}] not run: {why}" for op, impl, why in base if (op, impl, why) in head]
            + [f"base only: {op} [{impl}] not run: {why}" for op, impl, why in base if (op, impl, why) not in head]
            + [f"head only: {op} [{impl}] not run: {why}" for op, impl, why in head if (op, impl, why) not in base])


def summary(c: Comparison) -> str:
    counts = c.counts()
    n = len(c.regressions)
    head = f"{n} regression{'s' if n != 1 else ''}" if n else "no regressions"
    return f"{head} in {len(c.rows)} compared outputs (" + ", ".join(f"{v} {k}" for k, v in counts.items()) + ")"


def print_text(c: Comparison, plots: list[tuple[str, str, str]], *, show_all: bool = False, console=None) -> None:
    """The comparison as terminal tables: regressions, then improvements and changes."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if console is None:
        console = Console()
        if not console.is_terminal:
            console.width = 180     # logs and pipes: wide rows rather than folded cells
    say = functools.partial(console.print, markup=False, highlight=False, soft_wrap=True)
    for line in _header(c):
        say(line)
    sections = [("regressions", REGRESSIONS + ("still failing",)), ("improved", ("improved",)),
                ("changed within threshold", ("changed",)), ("new", ("new",))]
    if show_all:
        sections.append(("unchanged", ("unchanged",)))
    for title, statuses in sections:
        rows = c.by_status(*statuses)
        if not rows:
            continue
        columns = _columns(rows)
        table = Table(title=f"{title} ({len(rows)})", title_justify="left")
        for col in columns:
            table.add_column(Text(col), overflow="fold")
        for r in rows:
            table.add_row(*map(Text, _cells(r)[:len(columns)]), style="red" if r.status in REGRESSIONS else None)
        console.print(table)
    for line in _unavailable(c):
        say(line)
    for op, mode, link in plots:
        say(f"plot {op} {mode}: {link}")
    say(summary(c), style="bold red" if c.regressions else "bold green")


def _md_table(rows: list[Row]) -> list[str]:
    """A Markdown table of at most ``MAX_MARKDOWN_ROWS`` rows (a comment holds 65536 characters)."""
    columns = _columns(rows)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows[:MAX_MARKDOWN_ROWS]:
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in _cells(r)[:len(columns)]) + " |")
    if len(rows) > MAX_MARKDOWN_ROWS:
        out += ["", f"... and {len(rows) - MAX_MARKDOWN_ROWS} more: `refcheck drift compare` lists them all."]
    return out


def markdown(c: Comparison, plots: list[tuple[str, str, str]]) -> str:
    """The comparison as a pull-request comment: summary, regressions, collapsed details, plots."""
    regressions = c.by_status(*REGRESSIONS, "still failing")
    mark = ":x:" if c.regressions else ":white_check_mark:"
    out = [f"### refcheck drift: {mark} {summary(c)}", ""]
    out += [line + "  " for line in _header(c)]
    if regressions:
        failing = len(regressions) - len(c.regressions)
        title = f"Regressions ({len(c.regressions)})" + (f", still failing ({failing})" if failing else "")
        out += ["", f"#### {title}", ""] + _md_table(regressions)
        repro = sorted({r.point["reproduce"] for r in regressions})[:MAX_MARKDOWN_ROWS]
        out += ["", "<details><summary>reproduce</summary>", "", "```"] + repro + ["```", "", "</details>"]
    for title, status in (("improved", "improved"), ("changed within threshold", "changed"), ("new", "new")):
        rows = c.by_status(status)
        if rows:
            out += ["", f"<details><summary>{title} ({len(rows)})</summary>", ""] + _md_table(rows) + ["", "</details>"]
    unchanged = len(c.by_status("unchanged"))
    if unchanged:
        out += ["", f"{unchanged} outputs unchanged (bitwise the same error)."]
    if plots:
        out += ["", "Error growth (error vs T, log-log; solid head, dashed base, dotted bound): "
                + " · ".join(f"[{op} {mode}]({link})" for op, mode, link in plots)]
    unavailable = _unavailable(c)
    if unavailable:
        out += ["", "<details><summary>not run</summary>", ""] + [f"- {u}" for u in unavailable] + ["", "</details>"]
    return "\n".join(out)
