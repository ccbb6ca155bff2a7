"""The ``refcheck`` command line.

Each subcommand lives in its own module, which defines ``add_parser(subparsers)``; the parser's
``run(args) -> int`` default is the command. Exit codes: 0 fine, 1 a check failed, 2 usage error.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = tuple(f"refcheck.commands.{name}" for name in ("cli", "contract", "report", "fuzz", "verify",
                                                                          "drift", "budget_diff"))


class UsageError(Exception):
    """Bad command-line input: printed without a traceback, exit code 2."""


def add_parser(subparsers) -> None:
    from .selection import add_options
    p = subparsers.add_parser("list", help="list ops and their implementations, and whether each runs here",
                              description="refcheck list: every implementation of every op, and whether it runs here. "
                                          "On a terminal a table; piped, one implementation a line, tab-separated "
                                          "(op, impl, dtypes, knobs, backward, available here), nothing cut.")
    add_options(p, impl=False, dtype=False, budgets=False)
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(run=run_list)


def list_rows(selection) -> list[dict]:
    """One record a selected implementation: op, name, dtypes, knobs, backward, available, why not."""
    from ..model.ops import OPS

    rows = []
    for op in selection.ops or OPS:
        for impl in selection.implementations(op):
            why = impl.unavailable(selection.device)
            rows.append({"op": op, "impl": impl.name, "dtypes": list(impl.dtypes),
                         "knobs": {k: list(v) for k, v in impl.knobs.items()}, "backward": bool(impl.backward),
                         "available": why is None, "why_not": why, "description": impl.description})
    return rows


def run_list(args) -> int:
    import json

    from .selection import select

    selection = select(ops=args.op, op_cards=args.op_card, device=args.device, require_available=False)
    rows = list_rows(selection)
    if args.json:
        print(json.dumps({"device": selection.device, "implementations": rows}, indent=2, default=str))
        return 0
    cells = [(r["op"], r["impl"], ",".join(r["dtypes"]),
              ", ".join(f"{k}={'/'.join(map(str, v))}" for k, v in r["knobs"].items()) or "-",
              "yes" if r["backward"] else "no", "yes" if r["available"] else f"no: {r['why_not']}") for r in rows]
    header = ("op", "impl", "dtypes", "knobs", "backward", "available here")
    if not sys.stdout.isatty():     # piped: plain lines, nothing cut to a width (grep, cut -f, awk -F'\t')
        print("# " + "\t".join(header))
        for line in cells:
            print("\t".join(" ".join(c.split()) for c in line))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"refcheck implementations (device: {selection.device})")
    for col in header:
        table.add_column(col)
    for line in cells:
        table.add_row(*line)
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="refcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"refcheck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ..model.budgets import BudgetError
    from .selection import SelectionError
    try:
        return args.run(args)
    except (UsageError, SelectionError, BudgetError) as err:
        print(f"refcheck: error: {err}", file=sys.stderr)
        return 2
