"""Measure what the fp8 budgets of attention rest on (``[attention.{o,lse}.fp8e4m3|fp8e5m2]`` in
``tolerances.toml``): our fp8 forward (``optimized.attention`` with per-tensor descales, interpreted on
the CPU, Hopper's fp8 accumulator modelled) against the float64 truth on the values its inputs hold,
and the naive yardstick's error on the same case (``refcheck.model.naive.fp8_attention``).

    python benchmarks/fp8_attention_budgets.py --draws 600 --out benchmarks/results/fp8_attention_budgets_cpu.json

Cases are refcheck's attention strategy (GQA, T != S, causal or not, packed with empty spans, every
scale; ``LIMITS``) with the head dims of ``HEAD_DIMS``, in either format, with either schedule and
block size. Per output and format: the worst error of ours (its regression guard is about 3x that)
and the worst ratio error / naive (the contract factor is 3x that, at least 4), each with its case.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HEAD_DIMS = ((64, 64), (128, 128), (192, 128))
"""(Dqk, Dv): the usual head dims and MLA's."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=400, help="random cases, both formats together")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from refcheck.runtime import interpreter
    interpreter.interpret_new_kernels()  # before the kernel modules are imported
    interpreter.enable()
    import torch
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    from refcheck import references
    from refcheck.engine.laws import path_knobs
    from refcheck.model import registry
    from refcheck.model.budgets import DEFAULT_FLOOR
    from refcheck.model.metrics import rel_rms
    from refcheck.model.naive import fp8_attention
    from refcheck.model.ops.attention import FP8_DTYPES, cases, fp8_inputs
    from refcheck.strategies import Limits

    torch.set_num_threads(1)
    limits = Limits(max_batch=2, max_len=300, max_heads=3, max_elements=150_000, max_seqs=4, mla=False)
    ours = registry.get("attention", "triton")
    worst: dict[str, dict] = {}

    def measure(case, fmt, knobs):
        case = case.replace(dtype=fmt)
        kernel, held = fp8_inputs(case, "cpu")
        out = ours.fn(**kernel, **case.opts, **knobs)
        truth, naive = references.attention(**held, **case.opts), fp8_attention(held, **case.opts)
        for name, got, want, yardstick in zip(("o", "lse"), out, truth, naive):
            error, naive_error = rel_rms(got, want, DEFAULT_FLOOR), rel_rms(yardstick, want, DEFAULT_FLOOR)
            row = worst.setdefault(f"attention.{name}.{fmt}", {"error": 0.0, "ratio": 0.0, "naive": 0.0, "draws": 0})
            row["draws"] += 1
            row["naive"] = max(row["naive"], naive_error)
            where = f"{case.describe()} {' '.join(f'{k}={v}' for k, v in knobs.items())}"
            if error > row["error"]:
                row.update(error=error, error_case=where)
            if naive_error > 0 and error / naive_error > row["ratio"]:    # 0: no row sees a key
                row.update(ratio=error / naive_error, ratio_case=f"{where} (triton {error:.1e}, naive bf16 "
                                                                 f"{naive_error:.1e})")

    drawn = st.sampled_from(HEAD_DIMS).flatmap(
        lambda dims: cases(ours, limits, dtype="fp32", pinned={"Dqk": dims[0], "Dv": dims[1]}))
    strategy = dict(case=drawn, fmt=st.sampled_from(FP8_DTYPES), knobs=st.sampled_from(path_knobs(ours)))
    started = time.time()
    settings(max_examples=args.draws, deadline=None, database=None, suppress_health_check=list(HealthCheck))(
        seed(args.seed)(given(**strategy)(measure)))()
    args.out.write_text(json.dumps({"draws": args.draws, "seed": args.seed, "seconds": round(time.time() - started),
                                    "worst": dict(sorted(worst.items()))}, indent=1) + "\n")
    for key, row in sorted(worst.items()):
        print(f"{key:<24} {row['draws']:4} draws  error {row['error']:.2e}  ratio {row['ratio']:.3f}  "
              f"naive up to {row['naive']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
