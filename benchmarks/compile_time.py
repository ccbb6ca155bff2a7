"""Where a GPU law run's time goes: compile and autotune of a peer's kernels, per process.

    python benchmarks/compile_time.py --out results.json

Times one forward+backward of flash-linear-attention's ``chunk_kda`` (bf16, K = V = 64) in fresh
processes, so that nothing is cached in memory:
  cold     one process, empty Triton cache (compile + autotune every config of every kernel)
  warm     a second process, the same configuration (Triton's compile cache and the autotune results
           FLA keeps on disk)
  new_h    a process with another head count H (FLA's autotune keys include H, K, V)
  parallel N processes at once, each a head count of its own (does compiling scale over processes?)
Prints a table last and writes the timings as JSON.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path


def one_call(heads: int, dtype: str = "bfloat16", dim: int = 64, length: int = 300) -> float:
    """Seconds of one chunk_kda forward+backward in this process."""
    import torch
    import torch.nn.functional as F
    from fla.ops.kda import chunk_kda

    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, length, heads, dim)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen, dtype=dt).requires_grad_() for _ in range(3))
    g = F.logsigmoid(torch.randn(shape, device="cuda", generator=gen)).to(dt).requires_grad_()
    beta = torch.rand(shape[:3], device="cuda", generator=gen, dtype=dt).requires_grad_()
    started = time.perf_counter()
    o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    o.sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def _child(heads: int, queue) -> None:
    queue.put(one_call(heads))


def in_process(heads_list: list[int]) -> tuple[float, list[float]]:
    """Wall seconds of running each head count in a process of its own, all at once."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    started = time.perf_counter()
    procs = [ctx.Process(target=_child, args=(h, queue)) for h in heads_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    wall = time.perf_counter() - started
    return wall, sorted(queue.get() for _ in range(sum(p.exitcode == 0 for p in procs)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    rows = {}
    for name, heads in (("cold", [2]), ("warm", [2]), ("new_h", [3]),
                        ("parallel", list(range(4, 4 + args.parallel)))):
        wall, calls = in_process(heads)
        rows[name] = {"processes": len(heads), "wall_s": round(wall, 1), "call_s": [round(c, 2) for c in calls]}
        print(name, rows[name], flush=True)
    env = {k: os.environ.get(k) for k in ("TRITON_CACHE_AUTOTUNING", "FLA_CACHE_RESULTS", "TRITON_CACHE_DIR")}
    args.out.write_text(json.dumps({"rows": rows, "env": env}, indent=1) + "\n")
    print(f"{'run':<10} {'procs':>5} {'wall s':>8}  call s (in the process)")
    for name, r in rows.items():
        print(f"{name:<10} {r['processes']:>5} {r['wall_s']:>8}  {r['call_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
