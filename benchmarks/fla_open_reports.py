"""Confirm or refute flash-linear-attention's open correctness reports on a GPU, with refcheck's laws.

* fla-org/flash-linear-attention#671: KDA outputs depend on the batch size (a row run in a batch of
  4 differs from the same row run alone). Law ``batch_invariance`` on ``chunk_kda`` at B = 4, on
  the default gate path and the safe_gate path.
* fla-org/flash-linear-attention#1240 (fix proposed in #1242): on the ``safe_gate`` path, outputs
  and gradients at positions < P change when gates at positions >= P change, for a partially
  filled trailing sub-chunk (its exponentials are anchored on its last valid row). Law
  ``causality`` at T = 100 (last sub-chunk of 16: rows 96..99) with cuts 96, 97, 98: everything
  after the cut is replaced, gates included.

Each example runs through ``refcheck.engine.laws.check`` (not strict): the verdict within budget, and the
bitwise note with its max abs difference; our Triton ``kda`` runs the same examples beside it. All
the examples of one compile signature run in one worker process, the signatures in parallel
(``refcheck.runtime.workers``: a crash is a finding). Writes JSON (``--out``) and prints a table.

    python benchmarks/fla_open_reports.py --out benchmarks/results/fla_open_reports_h100.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from refcheck.engine.examples import Example
from refcheck.model.case import Case
from refcheck.runtime.backend import configure_backend

DIMS = {"H": 4, "K": 128, "V": 128}
SAFE = {"safe_gate": True, "lower_bound": -5.0, "use_gate_in_kernel": False, "use_qk_l2norm": False}
DEFAULT = {"safe_gate": False, "lower_bound": None, "use_gate_in_kernel": False, "use_qk_l2norm": True}


def _case(dtype: str, batch: int, length: int, options: dict, seed: int, clamp: float | None) -> Case:
    draw = {"initial_state": False, "gate_dtype": dtype, "normalizer": 1.0, "mask_p": 0.0, "spike_p": 0.0}
    if clamp is not None:
        draw["clamp"] = clamp
    return Case.make("kda", {"B": batch, "T": length, **DIMS}, dtype, seed,
                     options={"scale": None, "output_final_state": False, **options}, draw=draw)


def checks(dtype: str) -> dict[str, list[tuple[str, str, Example]]]:
    """The examples by compile signature: (report, law, example)."""
    safe_batch = _case(dtype, 4, 300, SAFE, 671, SAFE["lower_bound"])
    default_batch = _case(dtype, 4, 300, DEFAULT, 671, None)
    causal = _case(dtype, 1, 100, SAFE, 1240, SAFE["lower_bound"])
    return {
        "safe_gate": [("#671 (safe_gate path)", "batch_invariance", Example(safe_batch, "tf32")),
                      *[("#1240", "causality", Example(causal, "tf32", params={"cut": cut})) for cut in (96, 97, 98)]],
        "default": [("#671", "batch_invariance", Example(default_batch, "tf32"))],
    }


def run_group(items: list, impl_name: str, device: str) -> list[dict]:
    """Run one signature's examples on one implementation (in a worker process)."""
    from refcheck.engine.laws import LAWS, LawViolation, Trial, check
    from refcheck.model import registry

    impl = registry.get("kda", impl_name)
    found = []
    for report, law_name, example in items:
        mode = example.mode if example.mode in impl.modes else impl.modes[0]
        example = Example(example.case, mode, {}, example.params)
        trial = Trial(LAWS[law_name], impl, example.case, mode, {}, dict(example.params), device)
        started = time.perf_counter()
        try:
            notes, verdict = check(law_name, impl, example, device=device).notes, "holds within budget"
        except LawViolation as err:
            notes, verdict = [], "FAILS the budget: " + str(err).splitlines()[-2].strip()
        except Exception as err:  # an implementation that raises is a finding
            notes, verdict = [], f"raised {type(err).__name__}: {err}"
        found.append({"report": report, "law": law_name, "impl": impl_name, "case": example.case.describe(),
                      "params": example.params, "verdict": verdict, "bitwise": not notes, "notes": notes,
                      "seconds": round(time.perf_counter() - started, 2), "reproduce": trial.reproducer()})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32", "fp16"))
    parser.add_argument("--impl", action="append", default=None, help="kda implementations (default: fla_chunk, triton)")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = args.device
    configure_backend(device)
    from refcheck.commands.drift import environment
    from refcheck.runtime.workers import Unit, execute

    units = [Unit(f"{name} {group}", run_group, (items, name), 1.0, lambda rows: rows,
                  crashed=lambda message, items=items, name=name: [
                      {"report": r, "law": law, "impl": name, "verdict": f"crashed: {message}", "bitwise": False,
                       "notes": [], "case": ex.case.describe(), "params": ex.params} for r, law, ex in items])
             for group, items in checks(args.dtype).items() for name in args.impl or ["fla_chunk", "triton"]]
    started = time.perf_counter()
    rows = execute(units, device, min(args.jobs, len(units)), Console(stderr=True), "open reports")
    table = Table(title=f"flash-linear-attention open reports, kda {args.dtype}")
    for col in ("report", "law", "impl", "cut", "verdict", "bitwise", "max abs diff"):
        table.add_column(col)
    for r in rows:
        diff = r["notes"][0].split("max abs diff ")[-1].rstrip(")") if r["notes"] else ""
        table.add_row(r["report"], r["law"], r["impl"], str(r["params"].get("cut", "")), r["verdict"][:60],
                      "yes" if r["bitwise"] else "no", diff)
    Console(width=160).print(table)
    args.out.write_text(json.dumps({"what": __doc__.split("\n\n")[0], "environment": environment(device),
                                    "seconds": round(time.perf_counter() - started, 1), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
