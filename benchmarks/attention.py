"""Attention on a CUDA GPU: our Triton kernel (``optimized.attention``) against flash-attn-4 and torch SDPA.

    python benchmarks/attention.py --out attention.json    the full sweep (a few minutes on an H100)
    python benchmarks/attention.py --quick                 T = 2048 only, shorter timing

Shapes: bf16, H = 16 heads (no GQA), 16k tokens per batch (T = S = 2048, 8192, 16384 with
B = 16384 / T), causal and not, for MLA head dims (Dqk = 192, Dv = 128) and standard attention
(Dqk = Dv = 128). Each implementation is timed forward (under ``no_grad``) and backward alone
(``torch.autograd.grad`` of a retained forward graph for a fixed dO). Timing:
``triton.testing.do_bench`` medians (CUDA events, warmup first, L2 flushed between runs). Work model:

    forward flops  = 2 B H T S (Dqk + Dv), halved when causal (T = S here)
    backward flops = 2.5 x forward   (dQ, dK, dV and the recomputed S and dP: 5 matmuls to the forward's 2)

Ours runs at its default ``block_m`` (128 query rows a program) and again as ``ours_bm64`` (64),
whose ``x`` column is our default's time over its own. TFLOP/s are reported with the ratio of our
time to each peer's (``x fa4``, ``x sdpa``: above 1 we are slower) and as a fraction of a bf16
matmul (8192^3, ``bench_util.roofline``) measured in the same run. SDPA gets q, k, v as
``[B, H, T, D]`` views (``is_causal``: top-left, equal to the contract's bottom-right since T = S)
and picks its own backend; flash-attn-4
(``flash_attn.cute.flash_attn_func``) is skipped with a note where it is not installed or refuses a
shape. Errors: relative RMS ``||x - ref|| / ||ref||`` of o, lse, dq, dk, dv against
``references.attention`` in float64 on one small MLA shape (``ERROR_SHAPE``), for every implementation.

Models' layers (``MODELS``), ours against flash-attn-4 with the same options, forward and backward: gpt-oss
(64 query heads, 8 key heads, head dim 64, causal, sinks; its sliding layers' window of 128 keys and its full
layers) and Gemma 2 (32 and 16 heads, head dim 128, causal, softcap 50, window 4096). Their flops count the
(query, key) pairs the mask lets through (``visible_pairs``), so a window's TFLOP/s compare with a full layer's;
their errors against float64 at a small shape of each (``MODEL_ERROR_SHAPE``), dsinks included.

fp8: our forward on e4m3 q, k, v (per-tensor descale factors, o in bf16) at Dqk = Dv = 128, rows
``ours-fp8`` (``x bf16``: its time over our bf16 forward's; ``%mm`` still against the bf16 matmul,
the fp8 tensor-core peak is twice that), and its error vs float64 on the values the fp8 inputs hold.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_util import rel, roofline  # noqa: E402

from refcheck import optimized, references  # noqa: E402
from refcheck.model.ops.attention import fa4_attention  # noqa: E402

DEVICE = "cuda"
TOKENS = 16384
LENGTHS = (2048, 8192, 16384)
HEADS = 16
DIMS = {"mla": (192, 128), "d128": (128, 128)}
ERROR_SHAPE = dict(B=2, T=512, H=4, Dqk=192, Dv=128)
TIMING = {"full": dict(warmup=25, rep=100), "quick": dict(warmup=5, rep=20)}


def sdpa(q, k, v, *, causal=False):
    """torch SDPA on ``[B, T, H, D]`` tensors (T = S, equal head counts): ``(o, None)``."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return o.transpose(1, 2), None


def implementations() -> tuple[dict, dict]:
    """``({name: fn(q, k, v, causal=...) -> (o, lse or None)}, {name: why it is left out})``."""
    impls = {"ours": optimized.attention, "ours_bm64": functools.partial(optimized.attention, block_m=64), "sdpa": sdpa}
    try:
        import flash_attn.cute  # noqa: F401
        impls["fa4"] = fa4_attention
        return impls, {}
    except Exception as err:  # not installed, or a broken install: report it, time the others
        return impls, {"fa4": f"flash_attn.cute not importable: {type(err).__name__}: {err}"}


def make_inputs(B, T, H, Dqk, Dv, seed=0, dtype=torch.bfloat16, Hk=None):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return [torch.randn(B, T, h, d, device=DEVICE, generator=gen).to(dtype)
            for h, d in ((H, Dqk), (Hk or H, Dqk), (Hk or H, Dv))]


MODELS = {
    # name: (shape, options); sinks: a learnable logit per head (N(0, 1))
    "gpt-oss-sliding": (dict(B=4, T=4096, H=64, Hk=8, Dqk=64, Dv=64), dict(causal=True, window_size=(128, None),
                                                                         sinks=True)),
    "gpt-oss-full": (dict(B=4, T=4096, H=64, Hk=8, Dqk=64, Dv=64), dict(causal=True, sinks=True)),
    "gemma2-sliding": (dict(B=2, T=8192, H=32, Hk=16, Dqk=128, Dv=128), dict(causal=True, window_size=(4096, None),
                                                                           softcap=50.0)),
}
MODEL_ERROR_SHAPE = dict(B=1, T=1024)
"""The models' error shapes: their heads and head dims, these B and T (windows and options as timed)."""


def visible_pairs(T: int, options: dict) -> int:
    """(query, key) pairs a causal, windowed mask lets through for T queries and T keys."""
    left = (options.get("window_size") or (None, None))[0]
    rows = torch.arange(T, dtype=torch.float64) + 1
    seen = rows if left is None else rows.clamp(max=left + 1)
    return int(seen.sum()) if options.get("causal") else T * T


def model_inputs(shape: dict, options: dict, seed: int = 0):
    """``(q, k, v, options)`` of a model row, the sinks among the options where it has them."""
    q, k, v = make_inputs(shape["B"], shape["T"], shape["H"], shape["Dqk"], shape["Dv"], seed=seed, Hk=shape["Hk"])
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(shape["H"], device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(seed + 9))
    return q, k, v, options


def model_rows(impls, roof, timing) -> list[dict]:
    """ours and fa4 at each of ``MODELS``, forward and backward (the sinks' gradient with the rest)."""
    rows = []
    for model, (shape, opts) in MODELS.items():
        q, k, v, options = model_inputs(shape, opts)
        flops = 2 * shape["B"] * shape["H"] * visible_pairs(shape["T"], opts) * (shape["Dqk"] + shape["Dv"])
        ms = time_impls({n: impls[n] for n in ("ours", "fa4") if n in impls}, q, k, v, timing, **options)
        rows += timed_rows(ms, flops, roof, kind=model, B=shape["B"], T=shape["T"], H=shape["H"], Hk=shape["Hk"],
                           Dqk=shape["Dqk"], Dv=shape["Dv"], causal=True, options=dict(opts))
    return rows


def model_errors(impls) -> dict[str, dict[str, dict[str, float | str]]]:
    """Relative RMS errors of o, lse and every gradient (dsinks included) vs float64 at each model's heads and
    options, ``MODEL_ERROR_SHAPE``'s B and T, bf16 inputs."""
    out: dict[str, dict[str, dict[str, float | str]]] = {}
    for model, (shape, opts) in MODELS.items():
        q, k, v, options = model_inputs(shape | MODEL_ERROR_SHAPE, opts, seed=1)
        names = ["q", "k", "v"] + (["sinks"] if "sinks" in options else [])
        tensors = dict(zip(names, [q, k, v] + ([options.pop("sinks")] if "sinks" in options else [])))
        x64 = {n: t.double().requires_grad_() for n, t in tensors.items()}
        ro, rlse = references.attention(**x64, **options)
        do = torch.randn(ro.shape, device=DEVICE, dtype=torch.float64, generator=torch.Generator(DEVICE).manual_seed(2))
        want = torch.autograd.grad(ro, list(x64.values()), do)
        out[model] = {}
        for name in ("ours", "fa4"):
            if name not in impls:
                continue
            try:
                leaves = {n: t.detach().requires_grad_() for n, t in tensors.items()}
                o, lse = impls[name](**leaves, **options)
                got = torch.autograd.grad(o, list(leaves.values()), do.to(o.dtype))
            except Exception as err:
                out[model][name] = {"note": f"{type(err).__name__}: {err}"}
                continue
            out[model][name] = {"o": rel(o, ro), "lse": rel(lse, rlse)} | {
                f"d{n}": rel(g, w) for n, g, w in zip(names, got, want)}
    return out


def quantized(xs, dtype=torch.float8_e4m3fn) -> tuple[list[torch.Tensor], dict[str, float]]:
    """fp8 ``x / descale`` of each tensor (descale = max |x| / the format's max) and the
    ``{q,k,v}_descale`` keywords of ``optimized.attention``."""
    descale = [float(x.abs().max()) / torch.finfo(dtype).max for x in xs]
    return [(x / d).to(dtype) for x, d in zip(xs, descale)], dict(zip(("q_descale", "k_descale", "v_descale"), descale))


def fp8_row(T, causal, roof, timing) -> dict:
    """Our fp8 (e4m3) forward at Dqk = Dv = 128 against our bf16 forward."""
    from triton.testing import do_bench
    B = TOKENS // T
    xs = make_inputs(B, T, HEADS, 128, 128)
    x8, descale = quantized(xs)
    ms = do_bench(lambda: optimized.attention(*x8, causal=causal, **descale), return_mode="median", **timing)
    with torch.no_grad():
        bf16 = do_bench(lambda: optimized.attention(*xs, causal=causal), return_mode="median", **timing)
    f = forward_flops(B, T, HEADS, 128, 128, causal)
    row = dict(kind="d128", B=B, T=T, H=HEADS, Dqk=128, Dv=128, causal=causal, impl="ours-fp8", mode="fwd", ms=ms,
               tflops=f / ms / 1e9, pct_matmul=100 * f / ms / 1e9 / roof["bf16_tflops"], ours_time_ratio=ms / bf16)
    print(format_row(row), flush=True)
    return row


def forward_flops(B, T, H, Dqk, Dv, causal) -> float:
    return 2 * B * H * T * T * (Dqk + Dv) / (2 if causal else 1)


def time_pair(fn, q, k, v, timing, **options) -> tuple[float, float]:
    """(forward ms, backward ms) of ``fn`` with ``options``; the backward differentiates q, k, v and the sinks
    where the options have them."""
    from triton.testing import do_bench
    with torch.no_grad():
        fwd = do_bench(lambda: fn(q, k, v, **options), return_mode="median", **timing)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    if options.get("sinks") is not None:
        options = options | {"sinks": options["sinks"].detach().requires_grad_()}
        leaves.append(options["sinks"])
    o, _ = fn(*leaves[:3], **options)
    do = torch.randn_like(o)
    bwd = do_bench(lambda: torch.autograd.grad(o, leaves, do, retain_graph=True), return_mode="median", **timing)
    return fwd, bwd


def time_impls(impls, q, k, v, timing, **options) -> dict[str, tuple[float, float] | str]:
    """``time_pair`` of each implementation, or the note of what it raised (a peer that refuses the shape, or
    runs out of memory)."""
    ms: dict[str, tuple[float, float] | str] = {}
    for name, fn in impls.items():
        try:
            ms[name] = time_pair(fn, q, k, v, timing, **options)
        except Exception as err:
            ms[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            torch.cuda.empty_cache()
    return ms


def timed_rows(ms: dict, flops: float, roof: dict, **fields) -> list[dict]:
    """The rows of ``time_impls``'s times, forward and backward (2.5x the forward's flops), each with ``fields``,
    its TFLOP/s, its share of the bf16 matmul rate and our time over its own; printed as they are made."""
    rows = []
    for name, m in ms.items():
        for mode, i, f in (("fwd", 0, flops), ("bwd", 1, 2.5 * flops)):
            row = dict(fields, impl=name, mode=mode)
            if isinstance(m, str):
                row["note"] = m
            else:
                row.update(ms=m[i], tflops=f / m[i] / 1e9, pct_matmul=100 * f / m[i] / 1e9 / roof["bf16_tflops"])
                ours = ms.get("ours")
                if name != "ours" and isinstance(ours, tuple):
                    row["ours_time_ratio"] = ours[i] / m[i]
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def bench_shape(kind, T, causal, impls, roof, timing) -> list[dict]:
    """Rows of one shape: each implementation, forward and backward."""
    Dqk, Dv = DIMS[kind]
    B = TOKENS // T
    q, k, v = make_inputs(B, T, HEADS, Dqk, Dv)
    flops = forward_flops(B, T, HEADS, Dqk, Dv, causal)
    return timed_rows(time_impls(impls, q, k, v, timing, causal=causal), flops, roof, kind=kind, B=B, T=T, H=HEADS,
                      Dqk=Dqk, Dv=Dv, causal=causal)


HEADER = f"{'kind':5} {'T':>6} {'B':>3} {'causal':6} {'mode':4} {'impl':8} {'ms':>8} {'TFLOP/s':>8} {'%mm':>5} {'ours/x':>7}"


def format_row(r) -> str:
    head = f"{r['kind']:5} {r['T']:6} {r['B']:3} {str(r['causal']):6} {r['mode']:4} {r['impl']:8}"
    if "note" in r:
        return f"{head} {r['note']}"
    ratio = f"{r['ours_time_ratio']:7.2f}" if "ours_time_ratio" in r else f"{'-':>7}"
    return f"{head} {r['ms']:8.3f} {r['tflops']:8.1f} {r['pct_matmul']:5.1f} {ratio}"


def errors(impls) -> dict[str, dict[str, float | str]]:
    """Relative RMS errors of o, lse, dq, dk, dv vs float64 at ``ERROR_SHAPE`` (causal), bf16 inputs."""
    s = ERROR_SHAPE
    x = make_inputs(s["B"], s["T"], s["H"], s["Dqk"], s["Dv"], seed=1)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    do = torch.randn(s["B"], s["T"], s["H"], s["Dv"], device=DEVICE, generator=gen, dtype=torch.float64)
    x64 = [t.double().requires_grad_() for t in x]
    ro, rlse = references.attention(*x64, causal=True)
    rgrads = torch.autograd.grad(ro, x64, do)
    out: dict[str, dict[str, float | str]] = {}
    for name, fn in impls.items():
        try:
            leaves = [t.detach().requires_grad_() for t in x]
            o, lse = fn(*leaves, causal=True)
            grads = torch.autograd.grad(o, leaves, do.to(o.dtype))
        except Exception as err:
            out[name] = {"note": f"{type(err).__name__}: {err}"}
            continue
        errs: dict[str, float | str] = {"o": rel(o, ro)}
        if lse is not None:
            errs["lse"] = rel(lse, rlse)
        out[name] = errs | {f"d{n}": rel(g, r) for n, g, r in zip("qkv", grads, rgrads)}
    x8, descale = quantized(x)
    o, lse = optimized.attention(*x8, causal=True, **descale)
    ro, rlse = references.attention(*(t.double() * d for t, d in zip(x8, descale.values())), causal=True)
    out["ours-fp8"] = {"o": rel(o, ro), "lse": rel(lse, rlse)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here (after every shape)")
    ap.add_argument("--quick", action="store_true", help="T = 2048 only, shorter warmup and timing")
    ap.add_argument("--models-only", action="store_true", help="only the models' rows and their errors")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/attention.py needs a CUDA GPU")
    impls, skipped = implementations()
    timing = TIMING["quick" if args.quick else "full"]
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=__import__("triton").__version__, timing=timing, skipped=skipped,
                  roofline=roofline(), rows=[])

    def save():  # after every shape, so that a run cut short keeps what it measured
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)
    print(f"device {result['device']}: bf16 matmul {result['roofline']['bf16_tflops']:.0f} TFLOP/s; skipped: {skipped}")
    if not args.models_only:
        result["errors"] = errs = errors(impls)
        for name, e in errs.items():
            print(f"errors vs float64 {name} {ERROR_SHAPE}: " + " ".join(
                f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in e.items()))
        save()
        print(HEADER)
        for T in LENGTHS[:1] if args.quick else LENGTHS:       # shortest first: a run cut short keeps every kind
            for kind in DIMS:
                for causal in (False, True):
                    result["rows"] += bench_shape(kind, T, causal, impls, result["roofline"], timing)
                    save()
        for T in LENGTHS[:1] if args.quick else LENGTHS:
            for causal in (False, True):
                result["rows"].append(fp8_row(T, causal, result["roofline"], timing))
                save()
    result["model_errors"] = model_errs = model_errors(impls)
    for model, per_impl in model_errs.items():
        for name, e in per_impl.items():
            print(f"errors vs float64 {model} {name}: " + " ".join(
                f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in e.items()))
    save()
    result["rows"] += model_rows(impls, result["roofline"], timing)
    save()


if __name__ == "__main__":
    main()
