"""``refcheck verify OP --impl SPEC``: one verdict on one kernel, for a harness that scores candidates.

The grid (every point of OP in every dtype and mode the kernel takes, against the float64 truth), then
every law that concerns the kernel searched with Hypothesis for the time left of ``--seconds``, cheap
laws first, stopping at the first falsified law (``refcheck fuzz -x``). A kernel passes only where the grid
held and every law got at least one example and held: where the time ran out first (a slow kernel, or a short
``--seconds``), the verdict is "incomplete", never a pass that a law did not see. ``--json`` prints one object,
schema ``SCHEMA`` (2: "isolated" added; 3: "incomplete" and "uncovered")::

    {"schema": "refcheck.verdict/3", "op", "impl" (its target), "spec" (as given), "device", "refcheck": version,
     "isolated": whether the kernel ran in a process of its own,
     "seed", "verdict": "pass" | "fail" | "incomplete" | "usage_error", "seconds", "grid": {"points", "failed"},
     "declined": [{"extension", "grid_cases", "laws"}] (the contract's parts the kernel declines, the grid cases
                 and the laws not run for it),
     "laws": {"searched": [{"law", "examples", "status"}], "skipped": [{"law", "why"}]},
     "failures": [{"kind": "grid" | "law", "law": name or null, "case", "message", "reproduce"}],
     "uncovered": the laws that got no example (verdict "incomplete": none failed, these were not searched),
     "error": the usage error (verdict "usage_error" only)}

The kernel runs in a process of its own (``refcheck.runtime.candidate``: the environment of a plain script, none
of the judge's modules; its inputs sent in, its outputs copied out, the verdict formed here), unless
``--in-process``. Exit status 0 when it passes, 1 on a finding, 2 on a usage error (nothing ran), 3 when it is
incomplete. A harness loop::

    for candidate in candidates:
        done = subprocess.run(["refcheck", "verify", "attention", "--impl", f"{candidate}:attention",
                               "--seconds", "60", "--json"], capture_output=True, text=True)
        verdict = json.loads(done.stdout)      # verdict["verdict"], verdict["failures"][0]["law"], ...
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

SCHEMA = "refcheck.verdict/3"
"""The verdict's schema name; a change of its fields is a new number."""


def add_parser(subparsers) -> None:
    from .selection import add_options

    p = subparsers.add_parser("verify", help="one verdict on one kernel: the grid, then every law for --seconds",
                              description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("op", help="the op (refcheck list shows them; a user's with --op-card)")
    p.add_argument("--seconds", type=float, default=60.0, metavar="S",
                   help="the time for the whole verdict (default 60): the grid, then the laws for what is left")
    p.add_argument("--seed", type=int, default=0, help="the laws' search seed (default 0: the same verdict twice)")
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON object (schema refcheck.verdict/3)")
    p.add_argument("--in-process", action="store_true",
                   help="run the kernel in this process, beside the judge (default: in a process of its own that "
                        "holds neither the truth nor the budgets nor the laws; refcheck.runtime.candidate)")
    add_options(p, op=False)
    p.set_defaults(run=run)


def _usage_error(args, message: str) -> int:
    if args.json:
        print(json.dumps({"schema": SCHEMA, "op": args.op, "impl": " ".join(args.impl or []),
                          "verdict": "usage_error", "error": message}))
    else:
        print(f"refcheck verify: {message}")
    return 2


def _reproduce_line(text: str) -> str | None:
    found = re.search(r"reproduce: (.*)$", text, re.M)
    return found.group(1) if found else None


def run(args) -> int:
    from .. import __version__
    from .cli import UsageError
    from .fuzz import checked_selection, laws_to_search, search_all

    fuzz_args = argparse.Namespace(**vars(args), max_examples=None, threads=1, gpus="1", out_dir=Path("."),
                                   precision=None, isolated=not args.in_process)
    from .selection import items

    if not args.seconds > 0:
        return _usage_error(args, f"--seconds: expected a positive number, got {args.seconds}")
    if len(items(args.impl)) != 1:
        return _usage_error(args, f"--impl: verify judges one implementation (module:callable, or a registered name), "
                                  f"got {len(items(args.impl))}")
    try:
        device, impl = checked_selection(fuzz_args)
        laws, skipped = laws_to_search(impl, [])
    except UsageError as err:
        return _usage_error(args, str(err))
    if device != "cpu":
        return _usage_error(args, f"--device {device}: verify runs on the CPU for now (refcheck fuzz and report "
                                  "take a GPU)")

    import torch
    from hypothesis import settings as hsettings
    from rich.console import Console

    from ..engine import grid
    from ..model.ops import card
    from ..strategies import profiles

    torch.set_num_threads(1)
    started = time.monotonic()
    failures: list[dict] = []
    the_grid = grid.build(device, ops=[impl.op], impls=[impl.name], dtypes=tuple(args.dtype or ()) or None)
    outcomes = grid.run_points(list(the_grid.points), device)
    op_card = card(impl.op)
    for point, (verdict, crash, _) in zip(the_grid.points, outcomes):
        if verdict is not None and verdict.passed:
            continue
        message = crash if crash is not None else verdict.table()
        used = [e for e in op_card.extensions if e.used_by(point.case)]
        if used:     # the case uses a part of the contract the kernel may decline
            message += ("\n  (this case uses the extension(s) " + ", ".join(e.name for e in used) + " of the contract; "
                        "a kernel that does not implement one declines it: refcheck contract " + impl.op + ")")
        failures.append({"kind": "grid", "law": None, "case": point.case.describe(), "mode": point.mode,
                         "message": message, "reproduce": (verdict.reproducer(device) if verdict is not None else None)})
    grid_failed = len(failures)

    profiles.register()
    settings = hsettings(hsettings.get_profile("fuzz"), report_multiple_bugs=False, database=None)
    left = args.seconds - (time.monotonic() - started)
    results = []
    if left > 0 and not failures:
        results = search_all(impl, laws, settings, device=device, mode=None, seconds=left, strict=False,
                             seed=args.seed, console=Console(stderr=True, quiet=args.json), uncapped=True)
    for r in results:
        if r.failure is not None:
            failures.append({"kind": "law", "law": r.law.name, "case": r.failure.example.case.describe(),
                             "mode": r.failure.example.mode, "message": r.failure.text,
                             "reproduce": _reproduce_line(r.failure.text)})
    searched = [{"law": r.law.name, "examples": r.examples, "status": r.status} for r in results]
    why = ("a grid point failed" if grid_failed else "a law was falsified before it" if failures else "no time left")
    not_run = [{"law": law.name, "examples": 0, "status": f"not run ({why})"} for law in laws[len(results):]]
    uncovered = [] if failures else [s["law"] for s in searched + not_run if s["examples"] == 0]
    outcome = "fail" if failures else "incomplete" if uncovered else "pass"
    verdict = {"schema": SCHEMA, "op": impl.op, "impl": impl.target, "spec": items(args.impl)[0], "device": device,
               "isolated": impl.isolated,
               "refcheck": __version__, "seed": args.seed, "verdict": outcome,
               "seconds": round(time.monotonic() - started, 1),
               "grid": {"points": len(the_grid.points), "failed": grid_failed},
               "declined": [{"extension": name, "grid_cases": sum(n for op, i, e, n in the_grid.declined if e == name),
                             "laws": [law.name for law, why in skipped if why == f"declines extension {name}"]}
                            for name in sorted(op_card.declined(impl))],
               "laws": {"searched": searched + not_run, "skipped": [{"law": law.name, "why": why} for law, why in skipped]},
               "failures": failures, "uncovered": uncovered}
    if args.json:
        print(json.dumps(verdict, indent=1))
    else:
        print(f"refcheck verify {impl.op} [{impl.target}] on {device}: {verdict['verdict'].upper()} in "
              f"{verdict['seconds']} s: grid {len(the_grid.points) - grid_failed}/{len(the_grid.points)} points, "
              f"laws {sum(r.failure is None and r.examples > 0 for r in results)}/{len(laws)} hold")
        for f in failures:
            print(f"\n{f['kind']} {f['law'] or ''} {f['case']}:\n{f['message']}")
        if uncovered:
            print(f"incomplete: no example of {', '.join(uncovered)} within --seconds {args.seconds:g} (give it more)")
    return {"fail": 1, "incomplete": 3, "pass": 0}[outcome]
