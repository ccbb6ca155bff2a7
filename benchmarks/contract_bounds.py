"""Measure what the contract bounds of ``tolerances.toml`` rest on: for correct implementations that
round differently, the ratio of each output's error against the float64 truth to the naive error on
the same case (``refcheck.engine.verify.yardstick``), over random draws of refcheck's own strategies.

    python benchmarks/contract_bounds.py --draws 40 --out benchmarks/results/contract_bounds_cpu.json

Implementations: ours (the Triton kernels, interpreted on the CPU, every precision mode and knob),
the naive forms, torch SDPA, the example package's plain-PyTorch chunked simple GLA in both
precisions (``examples/my_simple_gla``), and a mixed-precision chunked GLA (``mixed_chunk_gla``).
The result, per op, output, dtype and mode: the worst
ratio ``(error - slack) / naive`` with its case, and the worst error where the naive error is 0.
A contract factor of about 3x the worst ratio leaves room for draws not seen here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mixed_chunk_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """GLA as a tensor-core kernel computes it, for calibration only: chunks of 64, every dot on
    operands rounded to the input dtype with float32 sums, the state and the cumulative log-decay
    ``G`` in float32, in-chunk decays ``exp(G_i - G_j)`` per channel (the same sequence and state
    bookkeeping as the references: ``references.recurrence.over_sequences``)."""
    import torch

    from refcheck.references.gla import gla_operands
    from refcheck.references.recurrence import over_sequences

    dt = q.dtype
    _, _, _, _, scale, kd, vd = gla_operands(q, k, v, g, scale=scale)

    def dot(a, b):
        return a.to(dt).float() @ b.to(dt).float()

    def run_sequence(state, seq):
        outs = [state.new_zeros(0, state.shape[0], vd)]
        for s in range(0, seq["q"].shape[0], 64):
            qc, kc, vc = (seq[n][s:s + 64].transpose(0, 1) for n in ("q", "k", "v"))      # [H, C, D]
            G = seq["g"][s:s + 64].transpose(0, 1).float().cumsum(1)                      # [H, C, K]
            c = G.shape[1]
            mask = torch.ones(c, c, dtype=torch.bool, device=G.device).tril()[None, :, :, None]
            decay = (G[:, :, None] - G[:, None, :]).masked_fill(~mask, float("-inf")).exp()  # [H, C, C, K]
            scores = torch.einsum("hik,hjk,hijk->hij", qc.float(), kc.float(), decay)
            o = scale * (dot(qc.float() * G.exp(), state) + dot(scores, vc))
            state = G[:, -1, :, None].exp() * state + dot((kc.float() * (G[:, -1:] - G).exp()).transpose(1, 2), vc)
            outs.append(o.transpose(0, 1).to(dt))
        return state, torch.cat(outs)

    o, final = over_sequences(run_sequence, dict(q=q, k=k, v=v, g=g), kd, vd,
                              None if initial_state is None else initial_state.float(), output_final_state, cu_seqlens)
    return o, None if final is None else final.float()


def implementations():
    from refcheck.model import registry
    sys.path.insert(0, str(ROOT / "examples" / "my_simple_gla"))
    impls = [i for i in registry.implementations() if i.name in ("triton", "naive_chunked", "sdpa")]
    for fn in ("chunk_simple_gla", "chunk_simple_gla_input_dtype"):
        impls += registry.resolve(f"simple_gla=mykernels:{fn}")
    impls += registry.resolve("gla=contract_bounds:mixed_chunk_gla")
    return impls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=30, help="random cases per implementation and dtype")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--impl", action="append", default=[], help="only these implementation names")
    args = parser.parse_args()

    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    from refcheck.runtime.backend import configure_backend
    configure_backend("cpu")
    import torch
    torch.set_num_threads(1)
    from refcheck.engine import verify
    from refcheck.engine.examples import cases
    from refcheck.engine.laws import interpreted, path_knobs
    from refcheck.model import budgets, registry
    from refcheck.strategies import INTERPRETED, SMALL

    loaded = budgets.load()
    worst: dict[str, dict] = {}
    started = time.time()
    for impl in implementations():
        if args.impl and impl.name not in args.impl:
            continue
        limits = INTERPRETED if interpreted(impl, "cpu") else SMALL
        count = max(2, args.draws // (4 if interpreted(impl, "cpu") else 1))

        def measure(case, mode, knobs):
            out = verify.run(impl, case, "cpu", True, **({"precision": mode} if "precision" in impl.knobs else {}),
                             **knobs)
            outputs = verify.cotangent_names(verify.card(case.op), registry.provides(impl))
            ref = verify.truth(case, impl.backward, outputs)
            for name in ref:
                if name not in out:
                    continue
                dtype = verify.budget_dtype(case, name, out[name])
                budget = loaded.get(case.op, name, dtype, mode)          # the contract bound (no guard)
                error = verify.rel_rms(out[name], ref[name], budget.floor)
                naive, form = verify.yardstick(case, name, budget.floor, outputs=outputs)
                key = f"{case.op}.{name}.{dtype}.{mode}"
                row = worst.setdefault(key, {"ratio": 0.0, "draws": 0, "of": set(), "at_zero": 0.0})
                row["draws"] += 1
                row["of"].add(impl.name)
                if naive is None or naive == 0:
                    row["at_zero"] = max(row["at_zero"], error)
                    continue
                ratio = max(0.0, error - budget.slack) / naive
                if ratio > row["ratio"]:
                    row.update(ratio=ratio, error=error, naive=naive, form=form, impl=impl.name,
                               case=case.describe(), bound=budget.bound(naive))
        t0 = time.time()
        strategy = dict(case=cases(impl.op, impl, limits), mode=st.sampled_from(list(impl.modes)),
                        knobs=st.sampled_from(path_knobs(impl)))
        settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))(
            seed(args.seed)(given(**strategy)(measure)))()
        print(f"{impl.op}/{impl.name}: {count} draws in {time.time() - t0:.0f} s", file=sys.stderr)
    rows = {k: {**v, "of": sorted(v["of"])} for k, v in sorted(worst.items())}
    args.out.write_text(json.dumps({"draws": args.draws, "seed": args.seed, "seconds": round(time.time() - started),
                                    "worst": rows}, indent=1, allow_nan=False, default=str) + "\n")
    over = {k: v for k, v in rows.items() if "bound" in v and v["error"] > v["bound"]}
    for k, v in rows.items():
        flag = "OVER" if k in over else ""
        print(f"{k:<34} ratio {v['ratio']:8.3g} ({v.get('impl', '-')}, {v.get('form', '-')}) "
              f"at_zero {v['at_zero']:.1e} {flag}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
