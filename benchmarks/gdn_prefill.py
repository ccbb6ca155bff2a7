"""Gated DeltaNet prefill and training on a GPU: our chunked kernels (``optimized.gated_delta_rule_chunk``) beside
flash-linear-attention's ``chunk_gated_delta_rule`` and FlashInfer's GDN prefill (forward only) where they import.

Qwen3.5's linear-attention layer as its modules call it: bf16 q, k, v, q and k l2-normalized in the kernel, the gate
computed in the kernel from ``a``, ``A_log`` and ``dt_bias`` (``use_gate_in_kernel``), beta already through its
sigmoid (bf16; FlashInfer's adapter hands it over as fp32), a final state, no initial one. Shapes (K = V = 128):
Qwen3.5's heads (16 query/key heads, 32 value heads) at B=8, T=4096, at B=1, T=32768 and over 8 packed sequences of
32768 tokens; its tensor-parallel-8 slice (2 and 8 heads) over one sequence of 65536 tokens (FlashInfer's own
comparison). Every implementation is called through its adapter in ``refcheck.model.ops.gated_delta_rule`` (the
calls the laws make).

Timing: ``triton.testing.do_bench`` medians, forward under ``no_grad``, forward+backward through
``torch.autograd.grad``; ratios are peer time over ours (above 1: ours faster). TFLOP/s by KDA's work model
(``benchmarks/kda.py``, ``work``, with the value heads) against the bf16 matmul rate of the same run. Errors:
relative RMS of o, the final state and (forward+backward) every gradient against the float64 chunked reference, on
one sequence of 2048 tokens at the row's heads (once per head configuration and implementation: rows of the same
heads share them).

    python benchmarks/gdn_prefill.py --out benchmarks/results/gdn_prefill_h200.json [--quick] [--kernels]

``--kernels``: then the CUDA time of each kernel (torch.profiler) of ours and the peers' forward and of our
forward+backward at the first shape, under ``kernels_ms``.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_util import kernel_times, rel, roofline, save_rows  # noqa: E402

K = V = 128
SHAPES = [  # label, H, HV, sequence lengths
    ("qwen3.5 B8 T4096", 16, 32, [4096] * 8),
    ("qwen3.5 B1 T32768", 16, 32, [32768]),
    ("qwen3.5 varlen 8x32k", 16, 32, [32768] * 8),
    ("qwen3.5 tp8 T65536", 2, 8, [65536]),
]
IMPLS = ("triton", "fla_chunk", "flashinfer")   # gated_delta_rule's implementation records


def make(h, hv, lengths, seed=0, device="cuda"):
    """Packed ``[1, total, heads, 128]`` bf16 q, k, v, the raw gate ``a`` and beta ``[1, total, hv]``, A_log and
    dt_bias ``[hv]`` (fp32), and cu_seqlens."""
    gen = torch.Generator(device=device).manual_seed(seed)
    total = sum(lengths)
    r = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    bf = torch.bfloat16
    return dict(q=r(1, total, h, K).to(bf), k=r(1, total, h, K).to(bf), v=r(1, total, hv, V).to(bf),
                g=r(1, total, hv).to(bf), beta=torch.rand(1, total, hv, device=device, generator=gen).to(bf),
                A_log=0.5 * r(hv), dt_bias=r(hv),
                cu_seqlens=torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32))


def call(fn, x):
    return fn(**x, use_qk_l2norm=True, use_gate_in_kernel=True, output_final_state=True)


DIFFERENTIABLE = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")


def time_forward(fn, x) -> float:
    from triton.testing import do_bench

    def fwd():
        with torch.no_grad():
            call(fn, x)
    return do_bench(fwd, warmup=10, rep=50, return_mode="median")


def time_backward(fn, x) -> float:
    from triton.testing import do_bench
    leaves = {n: (t.detach().requires_grad_() if n in DIFFERENTIABLE else t) for n, t in x.items()}
    o, ht = call(fn, leaves)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    wrt = [leaves[n] for n in DIFFERENTIABLE]
    return do_bench(lambda: torch.autograd.grad(call(fn, leaves), wrt, (do, dht)), warmup=5, rep=30,
                    return_mode="median")


@functools.cache
def truth(h: int, hv: int, device: str = "cuda"):
    """The float64 chunked reference on one sequence of 2048 tokens at these heads, once per head configuration:
    ``(inputs, o, final state, dO, dS1, the inputs' gradients)``, the upstream gradients seeded."""
    from refcheck import references
    x = make(h, hv, [2048], seed=1, device=device)
    x64 = {n: (t.double().requires_grad_(n in DIFFERENTIABLE) if t.is_floating_point() else t) for n, t in x.items()}
    ro, rht = call(references.gated_delta_rule_chunked, x64)
    gen = torch.Generator(device=device).manual_seed(2)
    do, dht = torch.randn(ro.shape, device=device, generator=gen), torch.randn(rht.shape, device=device, generator=gen)
    grads = torch.autograd.grad((ro, rht), [x64[n] for n in DIFFERENTIABLE], (do.double(), dht.double()))
    return x, ro.detach(), rht.detach(), do, dht, dict(zip(DIFFERENTIABLE, grads))


@functools.cache
def errors(fn, h: int, hv: int, backward: bool, device: str = "cuda") -> dict:
    """Relative RMS errors of fn against ``truth`` (o and the final state; with ``backward`` every gradient too),
    once per implementation and head configuration."""
    x, ro, rht, do, dht, truth_grads = truth(h, hv, device)
    if not backward:
        with torch.no_grad():
            o, ht = call(fn, x)
        return {"o": rel(o, ro), "final_state": rel(ht, rht)}
    leaves = {n: (t.detach().requires_grad_() if n in DIFFERENTIABLE else t) for n, t in x.items()}
    o, ht = call(fn, leaves)
    grads = torch.autograd.grad((o, ht), [leaves[n] for n in DIFFERENTIABLE], (do.to(o.dtype), dht.float()))
    out = {"o": rel(o, ro), "final_state": rel(ht, rht)}
    out.update({f"d{n}": rel(g, truth_grads[n]) for n, g in zip(DIFFERENTIABLE, grads)})
    return out


def implementations() -> dict:
    """name -> (adapter, backward?) or why it is unavailable."""
    from refcheck.model.registry import get
    found: dict = {}
    for name in IMPLS:
        impl = get("gated_delta_rule", name)
        why = impl.unavailable("cuda")
        found[name] = why if why else (impl.fn, impl.backward)
    return found


def work(h_v: int, lengths: list[int]) -> float:
    """Forward flops by KDA's work model (``benchmarks/kda.py``) over the value heads."""
    C = 64
    chunks = sum(math.ceil(n / C) for n in lengths)
    return chunks * h_v * (4 * C * C * K + 2 * C * C * (K + V) + 6 * C * K * V + 2 * C * C * V)


def kernels(found: dict, out: str | None) -> None:
    """Each kernel's CUDA time of every implementation's forward and of our forward+backward at the first shape,
    added to the results file under ``kernels_ms``."""
    _, h, hv, lengths = SHAPES[0]
    x = make(h, hv, lengths)
    steps = {}
    for name, entry in found.items():
        if isinstance(entry, tuple):
            steps[f"{name} fwd"] = lambda fn=entry[0]: time_step(fn, x, False)
    if isinstance(found.get("triton"), tuple):
        steps["triton fwd+bwd"] = lambda: time_step(found["triton"][0], x, True)
    times = kernel_times(steps, top=14)
    if out:
        data = json.loads(Path(out).read_text())
        data["kernels_ms"] = times
        Path(out).write_text(json.dumps(data, indent=1))


def time_step(fn, x, backward: bool) -> None:
    """One call (``kernels``): the forward under no_grad, or forward and backward."""
    if not backward:
        with torch.no_grad():
            call(fn, x)
        return
    leaves = {n: (t.detach().requires_grad_() if n in DIFFERENTIABLE else t) for n, t in x.items()}
    o, ht = call(fn, leaves)
    torch.autograd.grad((o, ht), [leaves[n] for n in DIFFERENTIABLE], (torch.ones_like(o), torch.ones_like(ht)))


def segments(shapes, lengths_tried: list[int], roof: dict, out: str | None) -> None:
    """Ours at each ``segment_chunks`` (and the default plan, None) per shape: forward and forward+backward ms."""
    import refcheck.optimized as optimized
    rows = []
    for label, h, hv, lengths in shapes:
        x = make(h, hv, lengths)
        for n in [None, *lengths_tried]:
            fn = functools.partial(optimized.gated_delta_rule_chunk, segment_chunks=n)
            row = {"shape": label, "segment_chunks": n, "fwd_ms": time_forward(fn, x), "fwd_bwd_ms": time_backward(fn, x)}
            print(f"{label:22} segment_chunks={n!s:5} fwd {row['fwd_ms']:.3f} ms  fwd+bwd {row['fwd_bwd_ms']:.3f} ms",
                  flush=True)
            rows.append(row)
            save_rows(out, roof, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here (after every row)")
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    ap.add_argument("--kernels", action="store_true", help="then each kernel's CUDA time at the first shape")
    ap.add_argument("--segment-chunks", nargs="+", type=int, metavar="N",
                    help="instead of the comparison: ours alone at each segment length of its serial passes "
                         "(knob segment_chunks; 0: unsplit), forward and forward+backward, at the shapes chosen")
    ap.add_argument("--shapes", nargs="+", metavar="WORD",
                    help="only the shapes whose label holds one of these words (e.g. tp8 varlen)")
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.shapes:
        shapes = [s for s in shapes if any(w in s[0] for w in args.shapes)]
        if not shapes:
            ap.error(f"--shapes: no shape's label holds {args.shapes}; the labels: {[s[0] for s in SHAPES]}")
    roof = roofline()
    if args.segment_chunks:
        segments(shapes, args.segment_chunks, roof, args.out)
        return
    found = implementations()
    print(f"roofline: bf16 {roof['bf16_tflops']:.0f} TFLOP/s, copy {roof['copy_gbps']:.0f} GB/s; implementations: "
          + ", ".join(f"{k} ({'ok' if isinstance(v, tuple) else v})" for k, v in found.items()), flush=True)
    rows = []
    for label, h, hv, lengths in shapes:
        x = make(h, hv, lengths)
        flops = work(hv, lengths)
        row: dict = {"shape": label, "H": h, "HV": hv, "K": K, "V": V, "lengths": lengths, "fwd_flops": flops}
        for name, entry in found.items():
            if not isinstance(entry, tuple):
                row[name] = {"error": entry}
                continue
            fn, backward = entry
            res: dict = {}
            try:
                res["fwd_ms"] = time_forward(fn, x)
                res["fwd_tflops"] = flops / res["fwd_ms"] / 1e9
                res["fwd_err"] = errors(fn, h, hv, False)
                if backward:
                    res["fwd_bwd_ms"] = time_backward(fn, x)
                    res["fwd_bwd_tflops"] = 3 * flops / res["fwd_bwd_ms"] / 1e9
                    res["grad_err"] = errors(fn, h, hv, True)
            except Exception as err:  # a peer's failure is a row of the results, not the end of the run
                res["error"] = f"{type(err).__name__}: {err}"[:300]
            row[name] = res
            torch.cuda.empty_cache()
        ours = row.get("triton", {})
        for peer in ("fla_chunk", "flashinfer"):
            for part in ("fwd_ms", "fwd_bwd_ms"):
                if part in ours and part in row.get(peer, {}):
                    row[f"{peer}_over_ours_{part[:-3]}"] = row[peer][part] / ours[part]
        rows.append(row)
        save_rows(args.out, roof, rows)
    if args.kernels:
        kernels(found, args.out)
    print(f"\n{'shape':22} {'ours fwd':>8} {'TFLOP/s':>7} {'fla/ours':>8} {'fi/ours':>7} {'ours f+b':>8} "
          f"{'fla/ours':>8} {'err o ours/fla/fi':>26} {'err dq ours/fla':>16}")
    for r in rows:
        o = r.get("triton", {})
        e = "/".join(f"{r.get(n, {}).get('fwd_err', {}).get('o', math.nan):.1e}" for n in IMPLS)
        dq = "/".join(f"{r.get(n, {}).get('grad_err', {}).get('dq', math.nan):.1e}" for n in IMPLS[:2])
        print(f"{r['shape']:22} {o.get('fwd_ms', math.nan):8.3f} {o.get('fwd_tflops', math.nan):7.0f} "
              f"{r.get('fla_chunk_over_ours_fwd', math.nan):8.2f} {r.get('flashinfer_over_ours_fwd', math.nan):7.2f} "
              f"{o.get('fwd_bwd_ms', math.nan):8.3f} {r.get('fla_chunk_over_ours_fwd_bwd', math.nan):8.2f} {e:>26} "
              f"{dq:>16}")


if __name__ == "__main__":
    main()
