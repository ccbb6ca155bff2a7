"""GLA and simple GLA on a CUDA GPU: our Triton kernels against flash-linear-attention 0.6.0 and float64.

    python benchmarks/gla.py --out gla.json     time every shape, both ops, forward and forward+backward
    python benchmarks/gla.py --quick            one shape (B8_T4096)
    python benchmarks/gla.py --profile          each kernel stage under several launches and stored-state dtypes

Shapes (bf16, H = 16, K = V = 128): B=8 T=4096; one sequence of 32768; a varlen batch of 8 packed
sequences (32768 tokens). Ours: ``optimized.gla`` / ``optimized.simple_gla`` (default knobs: tf32 dots,
chunk 64); FLA: ``chunk_gla`` / ``chunk_simple_gla`` through refcheck's adapters (rows say why when
fla is not installed or refuses). Timing: ``triton.testing.do_bench`` medians, forward under ``no_grad``, forward+backward through
``torch.autograd.grad``. The roofline is measured in the same run (``bench_util.roofline``: bf16 matmul
TFLOP/s, copy GB/s). Every op is first run at every shape in ``--jobs`` parallel processes, each
compiling its share of FLA's autotuning configs (``bench_util.autotune_share``; one process alone
took over 290 s for FLA's gla on an H100), so that the timed process finds every kernel compiled;
the CUDA time of each kernel (torch.profiler) of every implementation at B=8 T=4096 comes last.
Work model per (chunk of C = 64, head):

    flops = 2 C^2 K (Aqk) + 2 C^2 V (intra-chunk output) + 4 C K V (state update, inter-chunk output);
            forward+backward = 3x forward
    bytes = q, k, v, g and o once, plus the final state; the backward adds dO read and dq, dk, dv, dg
            written (g counts K values per token for gla, 1 for simple_gla)

Errors are relative RMS ``||x - ref|| / ||ref||`` against the float64 chunked reference on one small
shape (B=2, T=1024, H=4): o, the final state and every gradient, ours and FLA's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_util  # noqa: E402
from bench_util import rel, roofline  # noqa: E402

from refcheck import optimized, references  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
bench_util.faithful_on_cpu(DEVICE)
CHUNK = 64
SHAPES = {
    "B8_T4096": dict(B=8, T=4096, H=16, K=128, V=128, lengths=None),
    "B1_T32768": dict(B=1, T=32768, H=16, K=128, V=128, lengths=None),
    "varlen8_T32768": dict(B=1, T=32768, H=16, K=128, V=128,
                           lengths=[4096, 1000, 7000, 3000, 5000, 512, 8192, 3968]),
}
ERROR_SHAPE = dict(B=2, T=1024, H=4, K=128, V=128, lengths=None)
OPS = ("gla", "simple_gla")


def make_inputs(op, B, T, H, K, V, lengths, dtype=torch.bfloat16, seed=0, device=DEVICE):
    """q, v unit normal, k scaled by K^-1/2, log-decays ``logsigmoid(z) / 16`` (FLA's test scale),
    g ``[B, T, H, K]`` (gla) or ``[B, T, H]`` (simple_gla); cu_seqlens for packed lengths."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    g = F.logsigmoid(rnd(B, T, H, K) if op == "gla" else rnd(B, T, H)) / 16
    x = dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K) * K ** -0.5, v=rnd(B, T, H, V), g=g)
    cu = None if lengths is None else torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    return {n: t.to(dtype) for n, t in x.items()}, cu


def implementations(op):
    """``{"ours": fn, "fla": fn or None}`` and why FLA is missing ("" when present)."""
    ours = optimized.gla if op == "gla" else optimized.simple_gla
    try:
        import fla  # noqa: F401
    except ImportError:
        return {"ours": ours, "fla": None}, "fla not installed"
    if op == "gla":
        from refcheck.model.ops.gla import fla_chunk_gla as peer
    else:
        from refcheck.model.ops.simple_gla import fla_chunk_simple_gla as peer
    return {"ours": ours, "fla": peer}, ""


def work(op, B, T, H, K, V, lengths, dtype_bytes=2):
    """(forward flops, forward bytes, backward bytes) of the work model in the module docstring."""
    chunks = B * math.ceil(T / CHUNK) if lengths is None else sum(math.ceil(n / CHUNK) for n in lengths)
    C = CHUNK
    flops = chunks * H * (2 * C * C * (K + V) + 4 * C * K * V)
    gk = K if op == "gla" else 1
    tokens = B * T * H
    n_seq = B if lengths is None else len(lengths)
    fwd_bytes = tokens * (2 * K + 2 * V + gk) * dtype_bytes + n_seq * H * K * V * 4
    bwd_bytes = tokens * (3 * K + 2 * V + gk) * dtype_bytes
    return flops, fwd_bytes, bwd_bytes


def calls(fn, x, cu, do=None):
    """``(forward, forward+backward)``: no-argument calls of ``fn`` on the inputs ``x`` (the forward under
    ``no_grad``; the backward through ``torch.autograd.grad`` of o for the cotangent ``do``, ones if None)."""
    leaves = {n: t.detach().requires_grad_() for n, t in x.items()}

    def fwd():
        with torch.no_grad():
            fn(**x, cu_seqlens=cu, output_final_state=True)

    def fwd_bwd():
        o, _ = fn(**leaves, cu_seqlens=cu, output_final_state=True)
        torch.autograd.grad(o, list(leaves.values()), torch.ones_like(o) if do is None else do)
    return fwd, fwd_bwd


def time_ms(fn, x, cu, backward):
    """Median ms of one forward (``no_grad``) or forward+backward."""
    from triton.testing import do_bench
    fwd, fwd_bwd = calls(fn, x, cu, torch.randn_like(x["v"]))
    return do_bench(fwd_bwd if backward else fwd, return_mode="median")


def bench_shape(op, name, roof):
    """Rows of one op and shape: ours and FLA, forward and forward+backward."""
    s = SHAPES[name]
    x, cu = make_inputs(op, **s)
    impls, why = implementations(op)
    flops, fwd_bytes, bwd_bytes = work(op, **s)
    rows = []
    for backward in (False, True):
        ms = {}
        for impl, fn in impls.items():
            try:
                ms[impl] = time_ms(fn, x, cu, backward) if fn is not None else None
            except Exception as err:  # FLA refuses some configurations (e.g. its gated backward on Hopper)
                ms[impl], why = None, f"{type(err).__name__}: {str(err)[:120]}"
        f, b = flops * (3 if backward else 1), fwd_bytes + (bwd_bytes if backward else 0)
        for impl, m in ms.items():
            row = dict(op=op, shape=name, mode="fwd+bwd" if backward else "fwd", impl=impl, ms=m,
                       note=why if m is None else "")
            if m is not None:
                row.update(ratio_to_fla=ms["fla"] / m if ms.get("fla") else None, tflops=f / m / 1e9,
                           gbps=b / m / 1e6, pct_flops_roof=100 * f / m / 1e9 / roof["bf16_tflops"],
                           pct_bw_roof=100 * b / m / 1e6 / roof["copy_gbps"])
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


HEADER = f"{'op':10} {'shape':16} {'mode':8} {'impl':5} {'ms':>8} {'xFLA':>6} {'TFLOP/s':>8} {'GB/s':>7} {'%bw':>5}"


def format_row(r) -> str:
    if r["ms"] is None:
        return f"{r['op']:10} {r['shape']:16} {r['mode']:8} {r['impl']:5} {r['note']}"
    ratio = f"{r['ratio_to_fla']:.2f}" if r.get("ratio_to_fla") else "-"
    return (f"{r['op']:10} {r['shape']:16} {r['mode']:8} {r['impl']:5} {r['ms']:8.3f} {ratio:>6} "
            f"{r['tflops']:8.1f} {r['gbps']:7.0f} {r['pct_bw_roof']:5.1f}")


def errors(op):
    """Relative errors of o, the final state and every gradient vs the float64 chunked reference."""
    x, cu = make_inputs(op, **ERROR_SHAPE, seed=1)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    B, H, K, V = (ERROR_SHAPE[n] for n in "BHKV")
    do = torch.randn(*x["v"].shape, device=DEVICE, generator=gen)
    dht = torch.randn(B, H, K, V, device=DEVICE, generator=gen)
    chunked = references.gla_chunked if op == "gla" else references.simple_gla_chunked
    x64 = {n: t.detach().double().requires_grad_() for n, t in x.items()}
    ro, rht = chunked(**x64, cu_seqlens=cu, output_final_state=True)
    ref = dict(o=ro, final_state=rht, **dict(zip(x64, torch.autograd.grad((ro, rht), list(x64.values()),
                                                                          (do.double(), dht.double())))))
    out = {}
    for impl, fn in implementations(op)[0].items():
        if fn is None:
            continue
        leaves = {n: t.detach().requires_grad_() for n, t in x.items()}
        try:
            o, ht = fn(**leaves, cu_seqlens=cu, output_final_state=True)
            grads = torch.autograd.grad((o, ht), list(leaves.values()), (do.to(o.dtype), dht.to(ht.dtype)))
        except Exception as err:
            out[impl] = {"failed": f"{type(err).__name__}: {str(err)[:120]}"}
            continue
        got = dict(o=o, final_state=ht, **dict(zip(leaves, grads)))
        out[impl] = {n: rel(got[n], ref[n]) for n in got}
    return out


def warm_one(op, slot, slots, shapes):
    """Warm-up process ``slot`` of ``slots`` for one op: one forward (``no_grad``) and one forward+backward
    at each shape, of ours (in slot 0) and of FLA with its autotuned kernels trying their share of configs
    (``bench_util.autotune_share``)."""
    impls = implementations(op)[0]
    mine = ["ours"] if slot == 0 else []
    for name in shapes:
        x, cu = make_inputs(op, **SHAPES[name])
        for impl in [*mine, "fla"]:
            fn = impls[impl]
            if fn is None:
                continue
            fwd, fwd_bwd = calls(fn, x, cu)
            with bench_util.autotune_share(slot, slots):
                fwd()
                try:
                    fwd_bwd()
                except RuntimeError as err:  # FLA's gated backward refuses Triton < 3.7.1 on Hopper
                    print(f"{op} {impl} {name} backward: {err}", file=sys.stderr)
    torch.cuda.synchronize()


def kernel_times(op, name="B8_T4096"):
    """CUDA time per kernel (``bench_util.kernel_times``) of each implementation's forward and forward+backward."""
    x, cu = make_inputs(op, **SHAPES[name])
    steps = {}
    for impl, fn in implementations(op)[0].items():
        if fn is not None:
            fwd, fwd_bwd = calls(fn, x, cu)
            steps |= {f"{op} {impl} fwd": fwd, f"{op} {impl} fwd+bwd": fwd_bwd}
    return bench_util.kernel_times(steps)


# ---------------------------------------------------------------------------------------------- profile

SERIAL_VARIANTS = (dict(split_k=True), dict(split_k=True, num_warps=8), dict(split_k=True, num_warps=8, num_stages=2),
                   dict(split_k=True, BV=64, num_warps=8, num_stages=2), dict(split_k=False),
                   dict(split_k=False, num_stages=2), dict(split_k=False, num_stages=3), dict(split_k=False, num_warps=8))
"""Launches of the serial state passes (settings and ``split_k`` overridden; the default, ``chunk.split_by_k_block``,
picks split at B=1 T=32768, 8 warps, and unsplit at B=8 T=4096, 4 warps)."""
OUTPUT_VARIANTS = (dict(), dict(BK=64, BV=64, num_warps=8, num_stages=1), dict(BK=64, BV=128, num_warps=4, num_stages=1))
"""Launches of ``output_kernel`` (its ``output_ladder`` replaced), the default first."""
UPDATE_DOTS = (dict(bf16x2=True), dict(bf16x2=False))
"""The state passes' update dots forced on bf16 operands (``chunk.state.split_dot``: the fp32 operand in two bf16
parts) and forced to tf32 on fp32 operands, beside the default (``chunk.update_in_bf16x2``: bf16x2 for an unsplit
pass under "tf32"). Interpreted at B=1, T=256, H=2, K=V=128, bf16x2 took GLA's final state error 3.9e-4 -> 2.4e-6
and o 1.99e-3 -> 1.98e-3 against float64."""
STATES_DTYPES = (dict(hs="fp32"),)
"""The stored states in fp32 (``hs_dtype``) beside the default (``chunk.state_dtype``: the inputs' bf16), for the
forward's two launches and ``grads_qk_kernel``, which read them."""
INTRA_VARIANTS = (dict(), dict(BK=16, num_warps=4, num_stages=1), dict(BK=32, num_warps=4, num_stages=1))
"""Launches of ``intra_kernel`` (P), the default first."""
GRADS_VARIANTS = (dict(), dict(BK=32, BV=32, num_warps=8, num_stages=1), dict(BK=32, BV=32, num_warps=4, num_stages=2),
                  dict(BK=64, BV=32, num_warps=4, num_stages=3))
"""Launches of ``grads_qk_kernel`` (dq, dk, dG), the default first."""
DV_VARIANTS = (dict(BK=32, BV=128, num_warps=4, num_stages=1), dict(BK=64, BV=128, num_warps=4, num_stages=1),
               dict(BK=64, BV=64, num_warps=4, num_stages=1), dict(BK=32, BV=64, num_warps=4, num_stages=2),
               dict(BK=64, BV=128, num_warps=8, num_stages=1))
"""Launches of dv's ``output_kernel`` (``REVERSE``; its ``state_term_ladder`` replaced), timed with ``grads_qk_kernel``'s
default beside the ``grads_qk`` stage's first row."""
PROFILE = ([(op, "states", cfg) for op in OPS for cfg in (dict(), *STATES_DTYPES, *UPDATE_DOTS)]
           + [(op, "states", cfg) for op in OPS for cfg in SERIAL_VARIANTS]
           + [(op, "dstate", cfg) for op in OPS for cfg in (dict(), dict(split_k=True), *UPDATE_DOTS)]
           + [(op, "output", cfg) for op in OPS for cfg in OUTPUT_VARIANTS[1:]]
           + [(op, "intra", cfg) for op in OPS for cfg in INTRA_VARIANTS]
           + [(op, "grads_qk", cfg) for op in OPS for cfg in (*GRADS_VARIANTS, *STATES_DTYPES)]
           + [(op, "grads_v", cfg) for op in OPS for cfg in DV_VARIANTS])
PROFILE_SHAPES = ("B8_T4096", "B1_T32768")


def profile_data(op, name):
    """The inputs of each stage at one shape (bf16, the tf32 default): G, P, the stored states (bf16 and fp32),
    dO, their gradients dh and the chunk table."""
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.gla import chunk
    s = SHAPES[name]
    x, cu = make_inputs(op, **s)
    B, T, H, K = s["B"], s["T"], s["H"], s["K"]
    ch = make_chunks(B, T, cu, CHUNK, x["q"].device)
    GK = K if op == "gla" else 1
    scalar, scale = op != "gla", K ** -0.5
    G = chunk.chunk_cumsum(x["g"], torch.empty(B * T, H, GK, device=DEVICE), ch, H, T, GK, parts=1,
                           x_head_first=False, out_head_first=False, reverse=False)
    P = chunk.intra(x["q"], x["k"], G, ch, H, T, scale, False, scalar, "tf32")
    do = torch.randn_like(x["v"])
    hs = {dt: chunk.forward(x["q"], x["k"], x["v"], G, P, None, ch, H, T, scale, False, scalar, "tf32", final=False,
                            hs_dtype=dt)[2] for dt in (torch.bfloat16, torch.float32)}
    dh, _ = chunk.dstate(x["q"], G, do, None, ch, H, T, x["v"].shape[-1], scale, False, scalar, "tf32", False)
    return dict(x=x, ch=ch, G=G, P=P, H=H, T=T, scalar=scalar, scale=scale, do=do, hs=hs, dh=dh)


def profile_stage(d, stage, cfg):
    """A no-argument call of one stage: ``states`` and ``output`` time the forward's two launches together
    (the variant changes one of them; ``hs`` the stored states' dtype), ``dstate`` the reverse state pass,
    ``intra`` P, ``grads_qk`` and ``grads_v`` the backward's dq/dk/dG kernel with dv's, the variant changing
    one of them (``hs``: fp32 stored states read)."""
    from refcheck.optimized.gla import chunk
    x, scale, cfg = d["x"], d["scale"], dict(cfg)
    hs_dtype = {"fp32": torch.float32, None: torch.bfloat16}[cfg.pop("hs", None)]
    bf16x2 = cfg.pop("bf16x2", None)
    common = (d["ch"], d["H"], d["T"], scale, False, d["scalar"], "tf32")
    if stage in ("states", "output"):
        launches = {"serial" if stage == "states" else "output": cfg or None}
        return lambda: chunk.forward(x["q"], x["k"], x["v"], d["G"], d["P"], None, *common, final=True,
                                     hs_dtype=hs_dtype, bf16x2=bf16x2, **launches)
    if stage == "intra":
        return lambda: chunk.intra(x["q"], x["k"], d["G"], *common, config=cfg or None)
    if stage in ("grads_qk", "grads_v"):
        launches = {"qk" if stage == "grads_qk" else "dv": cfg or None}
        return lambda: chunk.grads(x["q"], x["k"], x["v"], d["G"], d["P"], d["hs"][hs_dtype], d["dh"], d["do"], *common,
                                   **launches)
    return lambda: chunk.dstate(x["q"], d["G"], d["do"].to(x["v"].dtype), None, d["ch"], d["H"], d["T"],
                                x["v"].shape[-1], scale, False, d["scalar"], "tf32", False, serial=cfg or None,
                                bf16x2=bf16x2)


def profile(jobs) -> list[dict]:
    """Compile every (op, stage, launch) of ``PROFILE`` in parallel processes, then time each at every
    ``PROFILE_SHAPES`` shape: rows of ms."""
    from triton.testing import do_bench
    bench_util.warm(__file__, [[str(i)] for i in range(len(PROFILE))], jobs, flag="--profile-one")
    rows = []
    for name in PROFILE_SHAPES:
        for op in OPS:
            d = profile_data(op, name)
            for o, stage, cfg in PROFILE:
                if o == op:
                    ms = do_bench(profile_stage(d, stage, cfg), return_mode="median")
                    rows.append(dict(shape=name, op=op, stage=stage, cfg=cfg, ms=ms))
                    print(f"{name:16} {op:10} {stage:8} {str(cfg):55} {ms:8.3f} ms", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--quick", action="store_true", help="one shape (B8_T4096)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="warm-up processes")
    ap.add_argument("--kernels-only", action="store_true", help="only the CUDA time of each kernel (B8_T4096)")
    ap.add_argument("--profile", action="store_true", help="time each kernel stage under several launches")
    ap.add_argument("--warm-one", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--profile-one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if DEVICE != "cuda":
        sys.exit("benchmarks/gla.py needs a CUDA GPU")
    if args.warm_one:
        op, slot, slots, *shapes = args.warm_one
        return warm_one(op, int(slot), int(slots), shapes)
    if args.profile_one is not None:
        op, stage, cfg = PROFILE[args.profile_one]
        for name in PROFILE_SHAPES:
            profile_stage(profile_data(op, name), stage, cfg)()
        return torch.cuda.synchronize()
    if args.profile:
        rows = profile(args.jobs)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)
        return
    shapes = ["B8_T4096"] if args.quick or args.kernels_only else list(SHAPES)
    slots = max(2, args.jobs // len(OPS))
    bench_util.warm(__file__, [[op, str(slot), str(slots), *shapes] for op in OPS for slot in range(slots)], args.jobs)
    roof = roofline()
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=__import__("triton").__version__, roofline=roof, rows=[], errors={}, kernels_ms={})
    print(f"device {result['device']}: bf16 matmul {roof['bf16_tflops']:.0f} TFLOP/s, copy {roof['copy_gbps']:.0f} GB/s")
    print(HEADER)

    def save():  # after every op, so that a run cut short keeps what it measured
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)
    for op in OPS if not args.kernels_only else ():
        for name in shapes:
            try:
                result["rows"] += bench_shape(op, name, roof)
            except Exception as err:  # keep the other shapes' results
                print(f"{op} {name}: failed: {type(err).__name__}: {err}", flush=True)
        save()
        result["errors"][op] = errs = errors(op)
        for impl, e in errs.items():
            print(f"{op} errors vs float64 ({impl}): " + " ".join(
                f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in e.items()), flush=True)
        save()
    for op in OPS:
        result["kernels_ms"] |= kernel_times(op)
        save()
    print(HEADER)
    for r in result["rows"]:
        print(format_row(r))


if __name__ == "__main__":
    main()
