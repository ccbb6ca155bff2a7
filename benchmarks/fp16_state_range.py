"""A state that outgrows fp16 while o does not: ours and flash-linear-attention on one fp16 input.

    python benchmarks/fp16_state_range.py [--device cuda] [--out fp16_state_range.json]

GLA and simple GLA, fp16, T = 130 (three chunks of 64), K = 16, V = 8, scale 1: no decay (g = 0),
k = 1, v = 2000, q = 1e-3. The entry state of the second chunk holds 64 x 2000 = 128000 per element,
beyond fp16's 65504, while o is at most 4162 (float64). An implementation that stores its per-chunk
states in the inputs' dtype returns inf there; ours keeps fp32 states for fp16 inputs
(``optimized.chunk.output.state_dtype``). Prints, per op and implementation, whether o is finite and its
relative error against float64; FLA through refcheck's adapters (``model.ops``), where installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def inputs(op: str, device: str):
    import torch
    T, K, V = 130, 16, 8
    q = torch.full((1, T, 1, K), 1e-3, device=device).half()
    k = torch.ones(1, T, 1, K, device=device).half()
    v = torch.full((1, T, 1, V), 2000.0, device=device).half()
    g = torch.zeros(1, T, 1, *(() if op == "simple_gla" else (K,)), device=device).half()
    return q, k, v, g


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where torch sees one, else cpu")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    from refcheck.runtime.backend import configure_backend
    device = configure_backend(args.device)   # before any kernel module is imported
    import torch

    from refcheck import optimized, references
    impls = {"gla": {"ours": optimized.gla}, "simple_gla": {"ours": optimized.simple_gla}}
    try:
        from refcheck.model.ops.gla import fla_chunk_gla
        from refcheck.model.ops.simple_gla import fla_chunk_simple_gla
        impls["gla"]["fla"], impls["simple_gla"]["fla"] = fla_chunk_gla, fla_chunk_simple_gla
    except ImportError as err:
        print(f"flash-linear-attention: not installed ({err})")
    rows = []
    for op, fns in impls.items():
        q, k, v, g = inputs(op, device)
        ro, _ = getattr(references, op)(q.double(), k.double(), v.double(), g.double(), scale=1.0)
        for name, fn in fns.items():
            try:
                o, _ = fn(q, k, v, g, scale=1.0)
                finite = bool(torch.isfinite(o).all())
                err = float((o.double() - ro).norm() / ro.norm()) if finite else float("inf")
                rows.append(dict(op=op, impl=name, finite=finite, rel_error=err, o_max_ref=float(ro.abs().max())))
            except Exception as exc:  # a refusal is a row too
                rows.append(dict(op=op, impl=name, failed=f"{type(exc).__name__}: {str(exc)[:160]}"))
            r = rows[-1]
            print(f"{op:10} {name:5} " + (f"failed: {r['failed']}" if "failed" in r else
                                          f"o finite {r['finite']!s:5}  rel error {r['rel_error']:.2e}"), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=str(device), torch=torch.__version__, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
