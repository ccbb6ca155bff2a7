"""Paged decode attention on a GPU: ours (``refcheck.optimized.paged_attention``) beside FlashInfer's paged
decode where it imports, as GB/s of the cache read against the device copy rate measured in the same run.

Shapes (bf16, one query token per sequence): GQA with 32 query heads on 8 key heads of 128 dims (Llama 3's
8B) at batch 64 and 256, caches of 4k and 32k tokens per sequence, pages of 16 and 64 tokens; MLA's absorbed
decode (16 query heads, one latent head, 576/512: DeepSeek-V3 at tensor parallelism 8) with pages of 64.
A decode step reads every cached key and value once, so its floor is the bytes of the cache it reads
(``cache_bytes``) over the copy rate; ``of_copy`` is the share of that rate reached. Errors: relative RMS of o
against the float64 reference on a batch of 4 of each configuration (the full batch would not fit in float64).

    python benchmarks/paged_attention.py --out benchmarks/results/paged_attention_h200.json [--quick]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_util import copy_rate_entry, rel, roofline, save_rows  # noqa: E402

SHAPES = [  # label, H, Hk, Dqk, Dv
    ("gqa 32/8 d128", 32, 8, 128, 128),
    ("mla absorbed 16/1 576/512", 16, 1, 576, 512),
]
BATCHES, CACHES, PAGES = (64, 256), (4096, 32768), (16, 64)


def make(n, length, h, hk, dqk, dv, page, seed=0, dtype=torch.bfloat16, device="cuda"):
    """q [n, 1, h, dqk], caches of n * length tokens in pages of ``page`` rows shuffled in the pool, the block
    table, the lengths (every sequence ``length`` tokens)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per = -(-length // page)
    pool = n * per
    q = torch.randn(n, 1, h, dqk, device=device, dtype=dtype, generator=gen)
    k = torch.randn(pool, page, hk, dqk, device=device, dtype=dtype, generator=gen)
    v = torch.randn(pool, page, hk, dv, device=device, dtype=dtype, generator=gen)
    table = torch.randperm(pool, device=device, generator=gen).view(n, per).to(torch.int32)
    used = torch.full((n,), length, device=device, dtype=torch.int32)
    return q, k, v, table, used


def cache_bytes(n, length, hk, dqk, dv, itemsize=2) -> int:
    return n * length * hk * (dqk + dv) * itemsize


def peers() -> dict:
    """name -> fn(q, k, v, table, used) -> o, for what imports here: ours, FlashInfer's paged decode."""
    from refcheck.optimized import paged_attention
    found = {"ours": lambda *x: paged_attention(*x)[0]}
    try:
        import flashinfer  # noqa: F401

        from refcheck.model.ops.paged_attention import flashinfer_paged_attention
        found["flashinfer"] = lambda *x: flashinfer_paged_attention(*x)[0]
    except Exception as err:   # not installed, or it cannot run here: say so in the results
        found["flashinfer"] = f"unavailable: {type(err).__name__}: {err}"[:300]
    return found


def median_ms(fn, *args, reps: int) -> float:
    from triton.testing import do_bench
    return do_bench(lambda: fn(*args), warmup=25, rep=reps, return_mode="median")


def error(fn, h, hk, dqk, dv, page, length) -> float:
    from refcheck import references
    x = make(4, min(length, 4096), h, hk, dqk, dv, page, seed=1)
    ref = references.paged_attention(*(t.double() if t.is_floating_point() else t for t in x))[0]
    return rel(fn(*x), ref)


SWEEP = [dict(BN=bn, num_warps=w, num_stages=st) for bn in (32, 64, 128) for w in (4, 8) for st in (2, 3)]
SPLIT_SCALES = (1, 4)
"""The default plan's programs, and four times as many (more key ranges, more loads in flight)."""
SWEEP_SHAPES = [("gqa 32/8 d128", 64, 32768, 16, 32, 8, 128, 128), ("gqa 32/8 d128", 256, 4096, 64, 32, 8, 128, 128),
                ("mla absorbed 16/1 576/512", 64, 32768, 64, 16, 1, 576, 512)]


def sweep(roof: dict, out: str | None) -> None:
    """Our split kernel on SWEEP_SHAPES under every launch setting of SWEEP (keys per step, warps, stages)."""
    from refcheck.optimized.paged_attention.decode import decode
    rows = []
    for label, n, length, page, h, hk, dqk, dv in SWEEP_SHAPES:
        x = make(n, length, h, hk, dqk, dv, page)
        size = cache_bytes(n, length, hk, dqk, dv)
        from refcheck.optimized.paged_attention.decode import plan_splits
        for config in SWEEP:
            for scale in SPLIT_SCALES:
                splits = plan_splits(n, hk, x[3].shape[1] * page, None, config["BN"])[0] * scale
                try:
                    ms = median_ms(decode, *x, dqk ** -0.5, "tf32", splits, config, reps=40)
                    row = dict(shape=label, batch=n, cache=length, page=page, **config, splits=splits, ms=ms,
                               of_copy=size / ms / 1e6 / roof["copy_gbps"])
                except Exception as err:
                    row = dict(shape=label, batch=n, cache=length, page=page, **config, splits=splits,
                               error=f"{type(err).__name__}"[:80])
                rows.append(row)
                print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    if out:
        Path(out).write_text(json.dumps(dict(roofline=roof, sweep=rows, device=torch.cuda.get_device_name()), indent=1))
    for label, n, length, page, *_ in SWEEP_SHAPES:
        mine = [r for r in rows if (r["shape"], r["batch"], r["cache"], r["page"]) == (label, n, length, page) and "ms" in r]
        best = min(mine, key=lambda r: r["ms"])
        print(f"best {label} b{n} c{length} p{page}: BN={best['BN']} warps={best['num_warps']} stages={best['num_stages']} "
              f"splits={best['splits']} "
              f"{best['ms']:.3f} ms, {best['of_copy']:.2f} of copy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here (after every row)")
    ap.add_argument("--quick", action="store_true", help="batch 64, caches of 4k, shorter timing")
    ap.add_argument("--sweep", action="store_true", help="our split kernel under every launch setting of SWEEP instead")
    args = ap.parse_args()
    roof = roofline()
    if args.sweep:
        return sweep(roof, args.out)
    found = peers()
    print(f"roofline: copy {roof['copy_gbps']:.0f} GB/s, bf16 {roof['bf16_tflops']:.0f} TFLOP/s; peers: "
          + ", ".join(f"{k} ({'ok' if callable(v) else v})" for k, v in found.items()), flush=True)
    rows, reps = [], 40 if args.quick else 100
    for label, h, hk, dqk, dv in SHAPES:
        for n in BATCHES[:1] if args.quick else BATCHES:
            for length in CACHES[:1] if args.quick else CACHES:
                for page in (64,) if dqk == 576 else PAGES:
                    x = make(n, length, h, hk, dqk, dv, page)
                    size = cache_bytes(n, length, hk, dqk, dv)
                    row = {"shape": label, "batch": n, "cache": length, "page": page, "cache_bytes": size}
                    for name, fn in found.items():
                        row[name] = copy_rate_entry(fn, lambda fn=fn, x=x: median_ms(fn, *x, reps=reps), size, roof,
                                                    lambda fn=fn: error(fn, h, hk, dqk, dv, page, length))
                    if "ms" in row.get("ours", {}) and "ms" in row.get("flashinfer", {}):
                        row["flashinfer_over_ours"] = row["flashinfer"]["ms"] / row["ours"]["ms"]
                    rows.append(row)
                    del x
                    torch.cuda.empty_cache()
                    save_rows(args.out, roof, rows)
    print(f"\n{'shape':28} {'batch':>5} {'cache':>6} {'page':>4} {'ours GB/s':>10} {'of copy':>7} {'flashinfer':>10} "
          f"{'fi/ours':>7}")
    for r in rows:
        ours, fi = r.get("ours", {}), r.get("flashinfer", {})
        print(f"{r['shape']:28} {r['batch']:5} {r['cache']:6} {r['page']:4} {ours.get('gbps', math.nan):10.0f} "
              f"{ours.get('of_copy', math.nan):7.2f} {fi.get('gbps', math.nan):10.0f} "
              f"{r.get('flashinfer_over_ours', math.nan):7.2f}")


if __name__ == "__main__":
    main()
