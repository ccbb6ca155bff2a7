"""Gated DeltaNet decode on a GPU: our recurrent kernel (``optimized.gated_delta_rule_recurrent``) beside
flash-linear-attention's ``fused_recurrent_gated_delta_rule`` and FlashInfer's ``gated_delta_rule_decode_pretranspose``
where they import, as GB/s of the state traffic against the device copy rate measured in the same run.

A decode step (one token per sequence, as serving runs Qwen3.5's linear-attention layers): each sequence's
float32 state ``[HV, V, K]`` (value-first, FlashInfer's layout) read from its slot of a pool and written back,
the gate computed in the kernel from ``a``, ``A_log`` and ``dt_bias``, beta from logits, q and k l2-normalized, bf16
q, k, v. The floor is the state's bytes, read and written (``state_bytes``: 2 x 4 HV K V a sequence), over the copy
rate; ``of_copy`` is the share of that rate reached. Shapes: Qwen3.5's heads (16 query/key heads, 32 value heads of
128) and its tensor-parallel-8 slice (2 and 8), 256 sequences from a pool of 1024 states, and 64 sequences.

Every implementation runs as serving would call it: ours and FlashInfer's on the pool in place (slots by index);
FLA's 0.6.0 recurrent kernel takes no pool, so its rows gather the states first and scatter them back after (what a
caller of it does: ``fla_gathered``). ``ours`` checks the slots (one read-back to the host a call),
``ours_unchecked`` does not (``check_slots=False``, as a serving loop calls it). Errors: relative RMS of o and
the written states against the float64 reference on 8 sequences of each shape.

    python benchmarks/gdn.py --out benchmarks/results/gdn_decode_h200.json [--quick]
    python benchmarks/gdn.py --sweep --out ...      our kernel under every launch of SWEEP
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

SHAPES = [("qwen3.5 16/32", 16, 32), ("qwen3.5 tp8 2/8", 2, 8)]   # label, H, HV (K = V = 128)
BATCHES = (256, 64)
POOL = 1024
K = V = 128


def make(n, h, hv, seed=0, pool=POOL, device="cuda"):
    """q, k ``[n, 1, h, K]``, v ``[n, 1, hv, V]`` (bf16), a and b ``[n, 1, hv]`` (raw gate, beta logits, bf16), A_log
    and dt_bias ``[hv]`` (fp32), a pool of ``pool`` fp32 states ``[pool, hv, V, K]`` and n distinct slots."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s, scale=1.0: scale * torch.randn(*s, device=device, generator=gen)  # noqa: E731
    bf = torch.bfloat16
    x = dict(q=r(n, 1, h, K).to(bf), k=r(n, 1, h, K).to(bf), v=r(n, 1, hv, V).to(bf), a=r(n, 1, hv).to(bf),
             b=r(n, 1, hv, scale=2.0).to(bf), A_log=r(hv, scale=0.5), dt_bias=r(hv))
    x["pool"] = r(pool, hv, V, K, scale=0.1)
    x["slots"] = torch.randperm(pool, device=device, generator=gen)[:n].to(torch.int32)
    return x


def state_bytes(n, hv) -> int:
    return 2 * n * hv * K * V * 4


def ours(x, **knobs):
    from refcheck.optimized import gated_delta_rule_recurrent
    return gated_delta_rule_recurrent(x["q"], x["k"], x["v"], x["a"], x["b"], initial_state=x["pool"],
                                      ssm_state_indices=x["slots"], inplace_final_state=True, use_qk_l2norm=True,
                                      use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                                      use_beta_sigmoid_in_kernel=True, state_v_first=True, **knobs)[0]


def ours_unchecked(x):
    """Ours as a serving loop calls it: the slots unchecked (``check_slots=False``), no read-back to the host."""
    return ours(x, check_slots=False)


def fla_gathered(x):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    slots = x["slots"].long()
    states = x["pool"][slots].transpose(-1, -2)                      # FLA's [N, HV, K, V]
    o, final = fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g=x["a"], beta=x["b"], initial_state=states,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                                                use_beta_sigmoid_in_kernel=True)
    x["pool"][slots] = final.transpose(-1, -2)
    return o


def flashinfer(x):
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose
    return gated_delta_rule_decode_pretranspose(x["q"], x["k"], x["v"], None, x["A_log"], x["a"], x["dt_bias"], x["b"],
                                                use_qk_l2norm=True, initial_state=x["pool"],
                                                initial_state_indices=x["slots"])[0]


def peers() -> dict:
    """name -> fn(inputs) -> o (the pool updated in place), or why it is unavailable."""
    found: dict = {"ours": ours, "ours_unchecked": ours_unchecked}
    for name, fn, module in (("fla_gathered", fla_gathered, "fla"), ("flashinfer", flashinfer, "flashinfer.gdn_decode")):
        try:
            __import__(module)
            found[name] = fn
        except Exception as err:
            found[name] = f"unavailable: {type(err).__name__}: {err}"[:300]
    return found


def error(fn, h, hv) -> dict:
    """Relative RMS errors of o and the written states against float64, 8 sequences from a pool of 16."""
    from refcheck import references
    x = make(8, h, hv, seed=1, pool=16)
    truth = x["pool"].double()
    ro, _ = references.gated_delta_rule(
        x["q"].double(), x["k"].double(), x["v"].double(), x["a"].double(), x["b"].double(), initial_state=truth,
        ssm_state_indices=x["slots"], inplace_final_state=True, use_qk_l2norm=True, use_gate_in_kernel=True,
        A_log=x["A_log"].double(), dt_bias=x["dt_bias"].double(), use_beta_sigmoid_in_kernel=True, state_v_first=True)
    o = fn(x)
    slots = x["slots"].long()
    return {"o": rel(o, ro), "state": rel(x["pool"][slots], truth[slots])}


SWEEP = [dict(BV=bv, num_warps=w) for bv in (16, 32, 64, 128) for w in (1, 2, 4, 8)]


def sweep(roof: dict, out: str | None) -> None:
    """Ours (slots unchecked) under every launch of SWEEP at Qwen3.5's heads, 256 and 64 sequences."""
    from triton.testing import do_bench
    rows = []
    for n in BATCHES:
        x = make(n, 16, 32)
        for config in SWEEP:
            ms = do_bench(lambda: ours(x, check_slots=False, config=config), warmup=25, rep=60, return_mode="median")
            rows.append(dict(batch=n, **config, ms=ms, of_copy=state_bytes(n, 32) / ms / 1e6 / roof["copy_gbps"]))
            print(json.dumps(rows[-1]), flush=True)
    if out:
        Path(out).write_text(json.dumps(dict(roofline=roof, sweep=rows, device=torch.cuda.get_device_name()), indent=1))
    for n in BATCHES:
        best = min((r for r in rows if r["batch"] == n), key=lambda r: r["ms"])
        print(f"best at {n} sequences: BV={best['BV']} warps={best['num_warps']} {best['ms']:.4f} ms, "
              f"{best['of_copy']:.2f} of copy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here (after every row)")
    ap.add_argument("--quick", action="store_true", help="256 sequences only, shorter timing")
    ap.add_argument("--sweep", action="store_true", help="our kernel under every launch of SWEEP instead")
    args = ap.parse_args()
    from triton.testing import do_bench
    roof = roofline()
    if args.sweep:
        return sweep(roof, args.out)
    found = peers()
    print(f"roofline: copy {roof['copy_gbps']:.0f} GB/s; peers: "
          + ", ".join(f"{k} ({'ok' if callable(v) else v})" for k, v in found.items()), flush=True)
    rows = []
    for label, h, hv in SHAPES:
        for n in BATCHES[:1] if args.quick else BATCHES:
            x = make(n, h, hv)
            size = state_bytes(n, hv)
            row: dict = {"shape": label, "H": h, "HV": hv, "K": K, "V": V, "batch": n, "pool": POOL, "state_bytes": size}
            for name, fn in found.items():
                reps = 40 if args.quick else 100
                row[name] = copy_rate_entry(
                    fn, lambda fn=fn: do_bench(lambda: fn(x), warmup=25, rep=reps, return_mode="median"), size, roof,
                    lambda fn=fn: error(fn, h, hv))
            for peer in ("fla_gathered", "flashinfer", "ours_unchecked"):
                if "ms" in row.get("ours", {}) and "ms" in row.get(peer, {}):
                    row[f"{peer}_over_ours"] = row[peer]["ms"] / row["ours"]["ms"]
            rows.append(row)
            save_rows(args.out, roof, rows)
    print(f"\n{'shape':18} {'batch':>5} {'ours ms':>8} {'GB/s':>6} {'of copy':>7} {'unchecked':>9} {'fla/ours':>8} "
          f"{'fi/ours':>8} {'fi of copy':>10} {'err o ours/fla/fi':>26}")
    for r in rows:
        o, fi, un = r.get("ours", {}), r.get("flashinfer", {}), r.get("ours_unchecked", {})
        errs = "/".join(f"{r.get(n, {}).get('rel_err', {}).get('o', math.nan):.1e}" for n in ("ours", "fla_gathered",
                                                                                              "flashinfer"))
        print(f"{r['shape']:18} {r['batch']:5} {o.get('ms', math.nan):8.4f} {o.get('gbps', math.nan):6.0f} "
              f"{o.get('of_copy', math.nan):7.2f} {un.get('of_copy', math.nan):9.2f} "
              f"{r.get('fla_gathered_over_ours', math.nan):8.2f} "
              f"{r.get('flashinfer_over_ours', math.nan):8.2f} {fi.get('of_copy', math.nan):10.2f} {errs:>26}")


if __name__ == "__main__":
    main()
