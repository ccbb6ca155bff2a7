"""The ``refcheck`` command line.

Each subcommand lives in its own module, which defines ``add_parser(subparsers)``; the parser's
``run(args) -> int`` default is the command. Exit codes: 0 fine, 1 a check failed, 2 usage error.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ..model import registry
from ..runtime.backend import configure_backend

COMMAND_MODULES = tuple(f"refcheck.commands.{name}" for name in ("cli", "report", "fuzz", "drift", "budget_diff"))


class UsageError(Exception):
    """Bad command-line input: printed without a traceback, exit code 2."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("list", help="list ops and their implementations, and whether each runs here")
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="cpu or cuda (default: cuda if available)")
    p.set_defaults(run=run_list)


def run_list(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..model.ops import OPS

    device = configure_backend(args.device)
    table = Table(title=f"refcheck implementations (device: {device})")
    for col in ("op", "impl", "dtypes", "knobs", "backward", "available here"):
        table.add_column(col)
    for op in OPS:
        for impl in registry.implementations(op):
            why = impl.unavailable(device)
            knobs = ", ".join(f"{k}={'/'.join(map(str, v))}" for k, v in impl.knobs.items()) or "-"
            table.add_row(op, impl.name, ",".join(impl.dtypes), knobs, "yes" if impl.backward else "no",
                          "yes" if why is None else f"no: {why}")
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
