"""Error-growth plots of two drift records: error against sequence length, log-log, base vs head.

One PNG per op and precision mode, ``{op}-{mode}.png``, with one panel per output (in the op card's
order). In a panel each implementation and dtype has one colour: the head's errors as a solid line
with dots, the base's dashed with crosses, the head's bound dotted. An error of exactly 0 cannot sit
on a log axis and is left out of its line. Drawn with matplotlib's Agg canvas directly (no pyplot, no global backend switch).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..model.ops import card

Series = dict[tuple[str, str], dict[str, list[tuple[int, float, float]]]]


def sweeps(rec: dict) -> dict[tuple[str, str], Series]:
    """``{(op, mode): {(impl, dtype): {output: [(T, error, bound), ...] sorted by T}}}`` of the
    sweep points of a record."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for p in rec["points"]:
        if not p["sweep"]:
            continue
        for name, m in p["outputs"].items():
            out[(p["op"], p["mode"])][(p["impl"], p["dtype"])][name].append((p["T"], m["error"], m["bound"]))
    for series in out.values():
        for lines in series.values():
            for points in lines.values():
                points.sort()
    return out


def _line(ax, pairs, **style) -> None:
    """Plot the (x, y) pairs a log axis can show (y finite and > 0); nothing when none is left."""
    kept = [(x, y) for x, y in pairs if math.isfinite(y) and y > 0]
    if kept:
        ax.plot([x for x, _ in kept], [y for _, y in kept], **style)


STYLES: dict[str, dict[str, Any]] = {"head": dict(linestyle="-", marker="o", markersize=4),
                                     "base": dict(linestyle="--", marker="x", markersize=5),
                                     "bound": dict(linestyle=":", linewidth=1)}
"""How each series of a line is drawn: head solid with dots, base dashed with crosses, bound dotted."""


def _output_order(op: str, names) -> list[str]:
    """Outputs in the op card's order (outputs, then gradients); unknown names last."""
    order = {n: i for i, n in enumerate(card(op).budget_outputs)}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


def _panel(ax, name: str, base: Series, head: Series, colors: dict) -> None:
    """One output's errors against T: every implementation and dtype, base and head, head's bound."""
    for line, color in colors.items():
        for side, series in (("base", base), ("head", head)):
            _line(ax, ((t, e) for t, e, _ in series.get(line, {}).get(name, [])), color=color, **STYLES[side])
        _line(ax, ((t, b) for t, _, b in head.get(line, {}).get(name, [])), color=color, **STYLES["bound"])
    lengths = sorted({t for s in (base, head) for lines in s.values() for t, _, _ in lines.get(name, [])})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(t) for t in lengths])
    ax.minorticks_off()
    ax.set_title(name)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("relative RMS error")
    ax.grid(True, alpha=0.3)


def plot_growth(base: dict, head: dict, out_dir: str | Path) -> list[tuple[str, str, Path]]:
    """Write ``{op}-{mode}.png`` into ``out_dir`` for every op and mode with sweep points in either
    record; returns ``(op, mode, path)`` in op and mode order."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base_sweeps, head_sweeps = sweeps(base), sweeps(head)
    written = []
    for op, mode in sorted(set(base_sweeps) | set(head_sweeps)):
        b, h = base_sweeps.get((op, mode), {}), head_sweeps.get((op, mode), {})
        outputs = _output_order(op, {name for s in (b, h) for lines in s.values() for name in lines})
        if not outputs:
            continue
        colors = {line: f"C{i % 10}" for i, line in enumerate(sorted(set(b) | set(h)))}
        ncols = min(3, len(outputs))
        nrows = math.ceil(len(outputs) / ncols)
        fig = Figure(figsize=(4.2 * ncols, 3.1 * nrows + 0.9), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, name in zip(axes, outputs):
            _panel(ax, name, b, h, colors)
        for ax in axes[len(outputs):]:
            ax.set_visible(False)
        handles = [Line2D([], [], color=c, linewidth=3, label=f"{impl} {dtype}") for (impl, dtype), c in colors.items()]
        handles += [Line2D([], [], color="0.3", label=side, **style) for side, style in STYLES.items()]
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize="small")
        fig.suptitle(f"{op}, precision {mode}: error against sequence length")
        path = out_dir / f"{op}-{mode}.png"
        fig.savefig(path, dpi=90)
        written.append((op, mode, path))
    return written
