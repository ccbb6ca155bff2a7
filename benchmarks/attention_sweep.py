"""Launch settings of our attention kernels, each timed on a CUDA GPU: the measurements behind the
defaults of ``optimized.attention`` (``Layout.ladder`` for the forward, the ladders of ``backward``).

    python benchmarks/attention_sweep.py --out attention_sweep.json [--jobs 16] [--T 2048]

Shapes: bf16, H = 16, T = S (B = 16384 / T), MLA head dims (192/128) and 128/128, causal and not.
For each shape: the forward under every setting of ``FORWARD``; the backward with each ``dq_kernel``
setting of ``DQ`` (``dkdv_kernel`` at its default) and each ``dkdv_kernel`` setting of ``DKDV`` (``dq_kernel``
at its default). Every (shape, setting) is compiled first in ``--jobs`` worker processes (a compile takes
5 to 30 s, the timing milliseconds); a setting the GPU refuses (``OutOfResources``) is noted, not timed.
ms: ``triton.testing.do_bench`` medians; TFLOP/s by ``attention.py``'s work model. Prints each shape's
six fastest settings per part.
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attention import DIMS, HEADS, TOKENS, forward_flops, make_inputs  # noqa: E402

FORWARD = ([dict(TMA=tma, BN=bn, num_warps=w, num_stages=s) for tma in (True, False)
            for bn, w in ((64, 4), (64, 8), (128, 8)) for s in (2, 3)]
           + [dict(BM=64, BN=bn, num_warps=4, num_stages=s) for bn in (64, 128) for s in (2, 3)]
           + [dict(schedule="persistent", BN=bn, num_warps=8, num_stages=3) for bn in (64, 128)])
"""Forward launches: 128 query rows (``block_m``) unless BM says otherwise; ``TMA``: key and value blocks loaded
through TMA descriptors or through pointers (default: TMA, the shapes here allowing it); 64 rows at 4 warps
leave room for two programs an SM, whose softmax and matmuls can overlap; ``schedule`` "persistent": one
program an SM looping over the tiles (``forward.SCHEDULES``)."""
DQ = ([dict(BM=bm, BN=bn, num_warps=w, num_stages=s) for bm, bn in ((128, 32), (128, 64), (64, 64))
       for w in (4, 8) for s in (2, 3)] + [dict(TMA=False, BM=128, BN=64, num_warps=8, num_stages=s) for s in (2, 3)])
DKDV = ([dict(BN=bn, BM=bm, num_warps=w, num_stages=s) for bn, bm in ((128, 32), (128, 64), (64, 32), (64, 64))
         for w in (4, 8) for s in (2, 3)] + [dict(TMA=False, BN=128, BM=64, num_warps=8, num_stages=s) for s in (2, 3)])
"""Backward launches of ``dq_kernel`` and ``dkdv_kernel``: the walked blocks through TMA descriptors (the default
where the shapes allow), and through pointers at the defaults (``TMA=False``)."""
PARTS = {"fwd": FORWARD, "dq": DQ, "dkdv": DKDV}


@functools.cache
def shape_inputs(kind: str, T: int, causal: bool):
    """``(q, k, v, o, lse, do, lay)`` flattened as the kernels take them, o and lse from our forward."""
    from refcheck.optimized.attention.api import _tokens
    from refcheck.optimized.attention.forward import forward
    from refcheck.optimized.attention.layout import make_layout
    Dqk, Dv = DIMS[kind]
    q, k, v = make_inputs(TOKENS // T, T, HEADS, Dqk, Dv)
    lay = make_layout(q, k, v, None, None, scale=Dqk ** -0.5, causal=causal, precision="tf32")
    q, k, v = (_tokens(x) for x in (q, k, v))
    o, lse = forward(q, k, v, lay, 128)
    return q, k, v, o, lse, torch.randn_like(o), lay


def runner(kind: str, T: int, causal: bool, part: str, cfg: dict):
    """A no-argument call of one kernel part under one setting."""
    from refcheck.optimized.attention.backward import backward
    from refcheck.optimized.attention.forward import forward
    q, k, v, o, lse, do, lay = shape_inputs(kind, T, causal)
    if part == "fwd":
        rows, schedule = cfg.get("BM", 128), cfg.get("schedule", "grid")
        return lambda: forward(q, k, v, lay, rows, ladder=[{n: x for n, x in cfg.items() if n not in ("BM", "schedule")}],
                               schedule=schedule)
    ladders = {"dq_ladder": [cfg]} if part == "dq" else {"dkdv_ladder": [cfg]}
    return lambda: backward(q, k, v, o, lse, do, None, lay, **ladders)


def compile_one(job) -> str:
    """Run one (shape, part, setting) once, in a worker: '' or why it failed."""
    try:
        runner(*job)()
        torch.cuda.synchronize()
        return ""
    except Exception as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:160]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--T", type=int, default=2048, help="tokens per sequence (B = 16384 / T)")
    ap.add_argument("--parts", nargs="*", default=list(PARTS), choices=list(PARTS))
    args = ap.parse_args()
    from triton.testing import do_bench
    shapes = [(kind, args.T, causal) for kind in DIMS for causal in (False, True)]
    jobs = [(*s, part, cfg) for s in shapes for part in args.parts for cfg in PARTS[part]]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = dict(zip(map(repr, jobs), pool.map(compile_one, jobs)))
    print(f"compiled {len(jobs)} settings in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for s in shapes:
        kind, T, causal = s
        Dqk, Dv = DIMS[kind]
        flops = forward_flops(TOKENS // T, T, HEADS, Dqk, Dv, causal)
        for part in args.parts:
            for cfg in PARTS[part]:
                job = (*s, part, cfg)
                row = dict(kind=kind, T=T, causal=causal, part=part, cfg=cfg)
                if failed[repr(job)]:
                    row["note"] = failed[repr(job)]
                else:
                    ms = do_bench(runner(*job), return_mode="median", warmup=10, rep=50)
                    row.update(ms=ms, tflops=flops * (1 if part == "fwd" else 2.5) / ms / 1e9)
                rows.append(row)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=__import__("triton").__version__, rows=rows)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    for s in shapes:
        for part in args.parts:
            timed = sorted((r for r in rows if (r["kind"], r["T"], r["causal"], r["part"]) == (*s, part)),
                           key=lambda r: r.get("ms", float("inf")))
            print(f"== {s[0]} T={s[1]} causal={s[2]} {part}")
            for r in timed[:6]:
                print(f"  {r.get('ms', float('nan')):8.3f} ms {r.get('tflops', 0):6.0f} TFLOP/s  {r['cfg']} "
                      f"{r.get('note', '')}")


if __name__ == "__main__":
    main()
