"""Measure what the Monte Carlo stage's factor (``[monte_carlo]`` of ``tolerances.toml``) rests on: for
correct kernels written from other formulas than refcheck's references (``tests/zoo``: online softmax,
the flash backward, chunked linear attention forming dg from ``q * dq - k * dk``, recurrences in the input
dtype, the WY form), the ratio of each output's error against the float64 truth to the Monte Carlo error
of the reference on the same case (``refcheck.engine.verify.monte_carlo_error``), over draws of
refcheck's own strategies and the zoo's degenerate cases.

    python benchmarks/monte_carlo_factors.py --draws 24 --out benchmarks/results/monte_carlo_factors_cpu.json

The result, per dtype: the worst ratio with its member, output and case, and the distribution (median,
95th percentile). The factor is about 3x the worst ratio; a bound below it would call such kernels wrong.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEMBERS = {
    "attention": ["online_softmax_b16", "online_softmax_b128_p_input", "flash_backward_fp32",
                  "flash_backward_input_dtype", "dense_textbook"],
    "simple_gla": ["simple_gla_chunk16_dg_cumsum", "simple_gla_chunk64_dg_cumsum", "simple_gla_recurrent_input_dtype"],
    "gla": ["gla_chunk16_dg_cumsum", "gla_chunk64_dg_cumsum", "gla_recurrent_input_dtype"],
    "gated_delta_rule": ["gated_delta_rule_wy_fp32", "gated_delta_rule_recurrent_input_dtype"],
}
"""The zoo's correct members by op (``tests/zoo/attention.py``, ``tests/zoo/linear.py``)."""


def drawn_cases(op: str, draws: int, seed: int) -> list:
    """``draws`` cases of the op's own strategy (SMALL sizes), reproducible for ``seed``."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from refcheck.model.ops import card
    from refcheck.strategies import SMALL

    found: list = []

    @hseed(seed)
    @settings(max_examples=draws, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(card(op).cases(None, SMALL))
    def collect(case):
        found.append(case)
    collect()
    return found[:draws]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=24, help="drawn cases per op")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", default=",".join(MEMBERS), help="comma-separated ops")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from refcheck.engine import verify
    from refcheck.model import registry
    from refcheck.model.metrics import rel_rms
    from refcheck.model.ops import card
    from tests import test_zoo_attention, test_zoo_linear

    torch.set_num_threads(1)
    dtypes = ("fp32", "bf16", "fp16")
    fixed = {"attention": [test_zoo_attention.attention(dt, seed=7, B=1, H=1, Hk=1, **p.values[0])
                           for p in test_zoo_attention.DEGENERATE for dt in dtypes]}
    fixed.update({op: [c for dt in dtypes for _, c in test_zoo_linear.degenerate_cases(op, dt)]
                  for op in MEMBERS if op != "attention"})
    rows, started = [], time.monotonic()
    for op in args.ops.split(","):
        module = "attention" if op == "attention" else "linear"
        impls = [registry.resolve(f"{op}=tests.zoo.{module}:{name}")[0] for name in MEMBERS[op]]
        cases = drawn_cases(op, args.draws, args.seed) + fixed[op]
        for case in cases:
            outputs = verify.cotangent_names(card(op), card(op).outputs)
            ref = verify.truth(case, True, outputs)
            for impl in impls:
                if case.dtype not in impl.dtypes:
                    continue
                out = verify.run(impl, case)
                for name in ref:
                    if name not in out:
                        continue
                    budget = verify.budgets_mod.load().get(op, name, verify.budget_dtype(case, name, out[name]), "ieee")
                    error = rel_rms(out[name], ref[name], budget.floor)
                    mc, form = verify.monte_carlo_error(case, name, budget.floor, "ieee", outputs=outputs)
                    naive, _ = verify.yardstick(case, name, budget.floor, outputs=outputs)
                    if mc is None or not math.isfinite(error):
                        continue
                    eps = torch.finfo(out[name].dtype).eps
                    rows.append({"op": op, "member": impl.name.split(":")[-1], "output": name, "dtype": case.dtype,
                                 "error": error, "monte_carlo": mc, "form": form, "naive": naive,
                                 "ratio": (error - eps) / mc if mc > 0 else (0.0 if error <= eps else math.inf),
                                 "case": case.describe()})
        print(f"{op}: {len(cases)} cases, {time.monotonic() - started:.0f} s", flush=True)
    summary = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        ratios = sorted(r["ratio"] for r in rows if r["dtype"] == dtype)
        worst = max((r for r in rows if r["dtype"] == dtype), key=lambda r: r["ratio"])
        summary[dtype] = {"measurements": len(ratios), "median": ratios[len(ratios) // 2],
                          "p95": ratios[int(0.95 * (len(ratios) - 1))], "worst": worst}
        print(f"{dtype}: {len(ratios)} measurements, (error - 1 ulp) / Monte Carlo error: median {ratios[len(ratios) // 2]:.2f}, "
              f"p95 {summary[dtype]['p95']:.2f}, worst {worst['ratio']:.2f} ({worst['member']} {worst['output']} "
              f"{worst['case']})")
    worst_of = {}
    for r in rows:   # the worst ratio of each member, output and dtype
        key = f"{r['op']}/{r['member']}/{r['output']}/{r['dtype']}"
        if key not in worst_of or r["ratio"] > worst_of[key]["ratio"]:
            worst_of[key] = r
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "draws": args.draws, "seed": args.seed,
                                        "measurements": len(rows), "summary": summary, "worst": worst_of},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
