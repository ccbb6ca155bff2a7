"""KDA on a CUDA GPU: our Triton kernels against flash-linear-attention 0.6.0 ``chunk_kda`` and float64.

    python benchmarks/kda.py --out kda.json     time the three shapes (bf16, K = V = 128), safe_gate off/on,
                                                then the CUDA time of each kernel (torch.profiler), ours and FLA's
    python benchmarks/kda.py --check --jobs 8   correctness against float64 over a set of configurations
    python benchmarks/kda.py --profile --jobs 8 time each kernel stage under several launch configurations
    python benchmarks/kda.py --kernels --shapes B1_T32768   the CUDA time of each kernel, forward and
                                                forward+backward, ours and FLA's, with the host's and the
                                                wall time of each call
    python benchmarks/kda.py --ncu-step         under Nsight Compute (``gpu.sh ncu`` gives the command):
                                                one B=8 forward+backward, ours and FLA's; then
    python benchmarks/kda.py --ncu-table k.csv  what bounds each kernel (hardware counters: DRAM and SM
                                                throughput, tensor pipe, occupancy, top stall reasons)

Timing: ``triton.testing.do_bench`` medians (L2 flushed between runs), forward under ``no_grad`` and
forward+backward through ``torch.autograd.grad`` (no gradient accumulation), for ``optimized.kda``
and FLA called with the same arguments (``refcheck.model.ops.kda.fla_chunk_kda``; rows say 'fla not installed' when
it is missing), after every configuration was compiled in parallel processes (``--jobs``; one
compile takes 5 to 30 s on an H200 and a process compiles one kernel at a time). The roofline is
measured in the same run: a bf16 matmul (TFLOP/s) and a device copy
(GB/s, read + write). Work model per (chunk of C = 64, head), forward:

    flops = 4 C^2 K (Aqk, Akk) + 2 C^2 (K + V) (WY factors) + 6 C K V (state read/write, inter-chunk
            output) + 2 C^2 V (intra-chunk output);       forward+backward = 3x forward
    bytes = the inputs read and outputs written once (q, k, v, g, beta, o, final state; the backward
            adds dO read and dq, dk, dv, dg, dbeta written)

Errors are relative RMS ``||x - ref|| / ||ref||`` against ``references.kda_chunked`` run in float64 on
the same (rounded) inputs; the gradient errors use a smaller shape. ``--check`` runs every
configuration in its own process (``--jobs`` at a time, sharing Triton's compile cache) and prints
one row per configuration with the error of o, the final state and every gradient. ``--profile``
compiles every (stage, launch configuration) pair in parallel processes, then times them one by one.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_util  # noqa: E402
from bench_util import rel, roofline  # noqa: E402

from refcheck import optimized, references  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run under TRITON_INTERPRET=1
bench_util.faithful_on_cpu(DEVICE)
CHUNK = 64
LOWER_BOUND = -5.0
SHAPES = {
    "B8_T4096": dict(B=8, T=4096, H=16, K=128, V=128, lengths=None),
    "B1_T32768": dict(B=1, T=32768, H=16, K=128, V=128, lengths=None),
    "varlen8_T32768": dict(B=1, T=32768, H=16, K=128, V=128,
                           lengths=[4096, 1000, 7000, 3000, 5000, 512, 8192, 3968]),
    # strong decay (g = 10 logsigmoid(z), no lower bound): most diagonal sub-chunk blocks exceed
    # DIAG_SPAN, so the general path sums them exactly; safe_gate does not apply
    "B8_T4096_strong": dict(B=8, T=4096, H=16, K=128, V=128, lengths=None, gate="strong"),
    "grads": dict(B=2, T=2048, H=16, K=128, V=128, lengths=None),  # gradient_errors
    "tiny": dict(B=1, T=70, H=1, K=128, V=128, lengths=None),  # CPU dry runs of --profile-one (a chunk and a part)
    # fp16 inputs (the others are bf16)
    "B8_T4096_fp16": dict(B=8, T=4096, H=16, K=128, V=128, lengths=None, dtype=torch.float16),
}
TIMED = ("B8_T4096", "B1_T32768", "varlen8_T32768", "B8_T4096_strong")


def make_inputs(B, T, H, K, V, lengths, dtype, seed=0, device=DEVICE, gate="logsigmoid"):
    """q, k, v, g, beta (+ cu_seqlens): unit-normal q and v, unit-length keys (the delta rule diverges
    when beta |k|^2 > 2), beta in (0, 1), and a log-decay g in [LOWER_BOUND, 0] (so that safe_gate's
    promise holds for every row), with ``gate="strong"`` 10 logsigmoid(z) unclamped, or with
    ``gate="raw"`` the unit-normal input of the gate."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    g = {"logsigmoid": lambda z: F.logsigmoid(z).clamp_min(LOWER_BOUND), "strong": lambda z: 10 * F.logsigmoid(z),
         "raw": lambda z: z}[gate](rnd(B, T, H, K))
    x = dict(q=rnd(B, T, H, K), k=F.normalize(rnd(B, T, H, K), dim=-1), v=rnd(B, T, H, V), g=g,
             beta=torch.sigmoid(rnd(B, T, H)))
    x = {n: t.to(dtype) for n, t in x.items()}
    cu = None if lengths is None else torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    return x, cu


def call(impl, x, cu, safe, **kw):
    return impl(**x, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=True, safe_gate=safe,
                lower_bound=LOWER_BOUND if safe else None, **kw)


def reference(x, cu, grads_of=None):
    """float64 chunked reference: (o, final_state) or, with ``grads_of`` (dO, dht), also the gradients."""
    x64 = {n: t.detach().double().requires_grad_(grads_of is not None) for n, t in x.items()}
    o, ht = references.kda_chunked(**x64, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=True)
    if grads_of is None:
        return o.detach(), ht.detach()
    gr = torch.autograd.grad((o, ht), list(x64.values()), grads_of)
    return o.detach(), ht.detach(), dict(zip(x64, gr))


# ------------------------------------------------------------------------------------------ timing


def work(B, T, H, K, V, lengths, dtype_bytes=2):
    """(forward flops, forward bytes, backward bytes) of the work model in the module docstring."""
    chunks = B * math.ceil(T / CHUNK) if lengths is None else sum(math.ceil(n / CHUNK) for n in lengths)
    C = CHUNK
    flops = chunks * H * (4 * C * C * K + 2 * C * C * (K + V) + 6 * C * K * V + 2 * C * C * V)
    tokens = B * T * H
    n_seq = B if lengths is None else len(lengths)
    fwd_bytes = tokens * ((3 * K + 2 * V + 1) * dtype_bytes) + n_seq * H * K * V * 4
    bwd_bytes = tokens * ((6 * K + 3 * V + 2) * dtype_bytes)
    return flops, fwd_bytes, bwd_bytes


def time_impl(impl, x, cu, safe, backward):
    from triton.testing import do_bench
    if not backward:
        def fwd():
            with torch.no_grad():
                call(impl, x, cu, safe)
        return do_bench(fwd, return_mode="median")
    leaves = {n: t.detach().requires_grad_() for n, t in x.items()}
    o, _ = call(impl, leaves, cu, safe)
    do = torch.randn_like(o)

    def fwd_bwd():
        out, _ = call(impl, leaves, cu, safe)
        torch.autograd.grad(out, list(leaves.values()), do)
    return do_bench(fwd_bwd, return_mode="median")


def fla_impl():
    try:
        import fla  # noqa: F401

        from refcheck.model.ops.kda import fla_chunk_kda as fla_kda
        return fla_kda, None
    except Exception as err:  # not installed here
        return None, f"fla not installed ({type(err).__name__})"


def safe_options(name) -> tuple[bool, ...]:
    """The safe_gate settings a shape is timed with (its gate must respect the lower bound for True)."""
    return (False,) if SHAPES[name].get("gate") == "strong" else (False, True)


def shape_inputs(name):
    s = SHAPES[name]
    return make_inputs(s["B"], s["T"], s["H"], s["K"], s["V"], s["lengths"], s.get("dtype", torch.bfloat16),
                       gate=s.get("gate", "logsigmoid"))


def warm_one(name, safe):
    """Compile (into Triton's on-disk cache) every kernel that timing ``name`` with ``safe`` runs: one
    forward+backward of ours and of FLA on the same inputs."""
    x, cu = shape_inputs(name)
    fla, _ = fla_impl()
    for impl in (optimized.kda, fla):
        if impl is not None:
            leaves = {n: t.detach().requires_grad_() for n, t in x.items()}
            o, ht = call(impl, leaves, cu, safe)
            torch.autograd.grad((o, ht), list(leaves.values()), (torch.ones_like(o), torch.ones_like(ht)))
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def warm(shapes, jobs):
    """``warm_one`` for every (shape, safe_gate) in parallel processes (``bench_util.warm``)."""
    bench_util.warm(__file__, [[name, str(safe)] for name in [*shapes, "grads"] for safe in safe_options(name)], jobs)


def bench(shapes, out_path, jobs):
    warm(shapes, jobs)
    dev = torch.cuda.get_device_name()
    roof = roofline()
    fla, why = fla_impl()
    result = dict(device=dev, torch=torch.__version__, triton=__import__("triton").__version__, roofline=roof,
                  rows=[], gradient_errors={})

    def save():  # after every shape, so that a run cut short keeps what it measured
        if out_path:
            with open(out_path, "w") as fh:
                json.dump(result, fh, indent=1)
    for name in shapes:
        try:
            result["rows"] += bench_shape(name, roof, fla, why)
        except Exception as err:  # keep the other shapes' results
            print(f"{name}: failed: {type(err).__name__}: {err}", flush=True)
        save()
    result["gradient_errors"] = grad_errs = gradient_errors(fla)
    save()
    rows = result["rows"]
    print(f"device {dev}: bf16 matmul {roof['bf16_tflops']:.0f} TFLOP/s, copy {roof['copy_gbps']:.0f} GB/s")
    print(HEADER)
    for r in rows:
        print(format_row(r))
    for name, e in grad_errs.items():
        print(f"gradient errors {name}: " + " ".join(f"{k} {v:.2e}" for k, v in e.items()))
    result["kernels_ms"] = kernel_times(fla)
    save()
    return not_finite(result)


def not_finite(result) -> list[str]:
    """Our errors that are not finite (printed): a timing of output that is not finite is no result."""
    bad = [f"{r['shape']} safe={r['safe_gate']} {r['mode']}" for r in result["rows"]
           if r["impl"] == "ours" and r["ms"] is not None
           and not all(math.isfinite(r[e]) for e in ("err_o", "err_final_state"))]
    bad += [f"gradients {name}" for name, e in result["gradient_errors"].items()
            if name.startswith("ours") and not all(math.isfinite(v) for v in e.values())]
    for b in bad:
        print(f"NOT FINITE: ours, {b}", flush=True)
    return bad


HEADER = (f"{'shape':16} {'safe':5} {'mode':8} {'impl':5} {'ms':>8} {'xFLA':>6} {'TFLOP/s':>8} {'GB/s':>7} "
          f"{'err o':>9} {'err ht':>9}")


def format_row(r) -> str:
    if r["ms"] is None:
        return f"{r['shape']:16} {str(r['safe_gate']):5} {r['mode']:8} {r['impl']:5} {r['note']}"
    ratio = f"{r['ratio_to_fla']:.2f}" if r.get("ratio_to_fla") else "-"
    return (f"{r['shape']:16} {str(r['safe_gate']):5} {r['mode']:8} {r['impl']:5} {r['ms']:8.3f} {ratio:>6} "
            f"{r['tflops']:8.1f} {r['gbps']:7.0f} {r['err_o']:9.2e} {r['err_final_state']:9.2e}")


def bench_shape(name, roof, fla, why):
    """Rows of one shape: ours and FLA, each of its ``safe_options``, forward and forward+backward."""
    rows = []
    s = SHAPES[name]
    x, cu = shape_inputs(name)
    t = time.perf_counter()
    ref_o, ref_ht = reference(x, cu)
    torch.cuda.synchronize()
    ref_s = time.perf_counter() - t
    flops, fwd_bytes, bwd_bytes = work(s["B"], s["T"], s["H"], s["K"], s["V"], s["lengths"])
    for safe in safe_options(name):
        ours_o, ours_ht = call(optimized.kda, x, cu, safe)
        errs = {"ours": (rel(ours_o, ref_o), rel(ours_ht, ref_ht))}
        if fla is not None:
            fo, fht = call(fla, x, cu, safe)
            errs["fla"] = (rel(fo, ref_o), rel(fht, ref_ht))
        for backward in (False, True):
            mode = "fwd+bwd" if backward else "fwd"
            ms = {"ours": time_impl(optimized.kda, x, cu, safe, backward)}
            ms["fla"] = time_impl(fla, x, cu, safe, backward) if fla is not None else None
            f = flops * (3 if backward else 1)
            b = fwd_bytes + (bwd_bytes if backward else 0)
            for impl in ("ours", "fla"):
                m = ms[impl]
                row = dict(shape=name, impl=impl, safe_gate=safe, mode=mode, ms=m,
                           note=why if (impl == "fla" and m is None) else "",
                           ref_f64_fwd_s=ref_s if impl == "ours" and not backward else None)
                if m is not None:
                    row.update(ratio_to_fla=(ms["fla"] / m) if ms["fla"] else None,
                               tflops=f / m / 1e9, gbps=b / m / 1e6,
                               pct_flops_roof=100 * f / m / 1e9 / roof["bf16_tflops"],
                               pct_bw_roof=100 * b / m / 1e6 / roof["copy_gbps"],
                               err_o=errs[impl][0], err_final_state=errs[impl][1])
                rows.append(row)
                print(format_row(row), flush=True)
    print(f"{name}: float64 chunked reference forward {ref_s:.2f} s", flush=True)
    return rows


def gradient_errors(fla):
    """Relative errors of every gradient vs float64 (bf16, safe_gate off/on), ours and FLA's, at
    ``SHAPES["grads"]``."""
    B, T, H, K, V = (SHAPES["grads"][n] for n in "BTHKV")
    x, cu = make_inputs(B, T, H, K, V, None, torch.bfloat16, seed=1)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    do = torch.randn(B, T, H, V, device=DEVICE, generator=gen)
    dht = torch.randn(B, H, K, V, device=DEVICE, generator=gen)
    _, _, ref = reference(x, cu, (do.double(), dht.double()))
    out = {}
    for impl_name, impl in (("ours", optimized.kda), ("fla", fla)):
        if impl is None:
            continue
        for safe in (False, True):
            leaves = {n: t.detach().requires_grad_() for n, t in x.items()}
            o, ht = call(impl, leaves, cu, safe)
            gr = torch.autograd.grad((o, ht), list(leaves.values()), (do.to(o.dtype), dht))
            out[f"{impl_name} safe={safe}"] = {f"d{n}": rel(gv, ref[n]) for n, gv in zip(leaves, gr)}
    return out


def steps(fla, shape, backward=True):
    """One no-argument call per (implementation, safe_gate) on the inputs of ``shape``: a forward+backward
    (a forward alone without ``backward``), ours and FLA's, safe_gate off/on (off alone where the shape's gate is
    not bounded): ``{"ours safe=False": step, ...}``."""
    x, cu = shape_inputs(shape)
    out = {}
    for impl_name, impl in (("ours", optimized.kda), ("fla", fla)):
        for safe in safe_options(shape) if impl is not None else ():
            leaves = {n: t.detach().requires_grad_(backward) for n, t in x.items()}

            def step(impl=impl, leaves=leaves, safe=safe):
                with torch.set_grad_enabled(backward):
                    o, _ = call(impl, leaves, cu, safe)
                    if backward:
                        torch.autograd.grad(o, list(leaves.values()), torch.ones_like(o))
            out[f"{impl_name} safe={safe}"] = step
    return out


def kernel_times(fla, shape="B8_T4096", backward=True):
    """CUDA time per kernel of each of ``steps`` (``bench_util.kernel_times``): ``{"ours safe=False": {kernel: ms},
    ...}``."""
    return bench_util.kernel_times(steps(fla, shape, backward))


def host_and_wall(step, calls=5):
    """``(host, wall)`` ms of one call of ``step``: the host's time to queue it (``calls`` in a row, no wait for the
    GPU in between) and ``do_bench``'s median. Where the host takes longer than the kernels, the GPU waits between
    them and the wall time exceeds the kernels' sum."""
    from triton.testing import do_bench
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        step()
    host = (time.perf_counter() - t) / calls * 1e3
    torch.cuda.synchronize()
    return host, do_bench(step, return_mode="median")


def host_calls(step, top=14) -> str:
    """The host's calls of one ``step`` (after one untimed) by their own time on the host, torch.profiler: where the
    host waits for the GPU (``cudaStreamSynchronize``, ``cudaMemcpy``, ``cudaFree``), or what keeps it busy."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.set_sync_debug_mode("warn")  # a warning, with its stack, at each call that waits for the GPU
    step()
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def kernels(shapes, out_path, jobs, ours_only=False):
    """``kernel_times`` of every shape, forward and forward+backward, with each step's host and wall time
    (``host_and_wall``): ``{"shapes": {shape: {mode: {step: {kernel: ms}}}}, "host_wall_ms": ...}``. ``ours_only``:
    without FLA, and without the parallel compiles (ours compile in a minute or two; FLA's autotuning takes longer)."""
    fla, why = (None, "not asked for") if ours_only else fla_impl()
    if not ours_only:
        bench_util.warm(__file__, [[name, str(safe)] for name in shapes for safe in safe_options(name)], jobs)
    if fla is None:
        print(f"FLA: {why}")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "shapes": {}, "host_wall_ms": {}}
    for name in shapes:
        for mode, backward in (("fwd", False), ("fwd+bwd", True)):
            print(f"== {name} {mode}", flush=True)
            named = steps(fla, name, backward)
            result["shapes"].setdefault(name, {})[mode] = bench_util.kernel_times(named)
            for step_name, step in named.items():
                host, wall = host_and_wall(step)
                if step_name == "ours safe=False":
                    print(host_calls(step), flush=True)
                key = f"{name} {mode} {step_name}"
                result["host_wall_ms"][key] = dict(host=round(host, 3), wall=round(wall, 3))
                print(f"host/wall {key}: host {host:.3f} ms, wall {wall:.3f} ms", flush=True)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)


# ---------------------------------------------------------------------------- hardware counters (ncu)

NCU_METRICS = {
    "ms": "gpu__time_duration.sum",
    "dram%": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram MB": "dram__bytes.sum",
    "sm%": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor%": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "issue%": "sm__inst_issued.avg.pct_of_peak_sustained_elapsed",
    "occ%": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "regs": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "local MB": "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
}
STALLS = ("long_scoreboard", "barrier", "short_scoreboard", "wait", "math_pipe_throttle", "mio_throttle",
          "lg_throttle", "not_selected", "membar", "dispatch_stall", "no_instruction", "branch_resolving",
          "drain", "imc_miss", "sleeping", "tex_throttle", "misc", "selected")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def ncu_metrics() -> str:
    return ",".join([*NCU_METRICS.values(), *(STALL_METRIC.format(s) for s in STALLS)])


def ncu_step(shape="B8_T4096"):
    """One forward+backward of ours and of FLA (safe_gate off) between cudaProfilerStart/Stop, after an
    untimed one of each that compiles and autotunes: what ``ncu --profile-from-start off`` measures."""
    x, cu = shape_inputs(shape)
    fla, why = fla_impl()
    runs = [("ours", optimized.kda)] + ([("fla", fla)] if fla is not None else [])
    for _, impl in runs * 2:
        leaves = {n: t.detach().requires_grad_() for n, t in x.items()}
        o, _ = call(impl, leaves, cu, False)
        torch.autograd.grad(o, list(leaves.values()), torch.ones_like(o))
    torch.cuda.synchronize()
    for name, impl in runs:
        leaves = {n: t.detach().requires_grad_() for n, t in x.items()}
        torch.cuda.nvtx.range_push(name)
        torch.cuda.cudart().cudaProfilerStart()
        o, _ = call(impl, leaves, cu, False)
        torch.autograd.grad(o, list(leaves.values()), torch.ones_like(o))
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        torch.cuda.nvtx.range_pop()
    if why:
        print(why, file=sys.stderr)


def ncu_table(path, out=None):
    """The table of an ``ncu --csv --page raw`` file of ``ncu_step``: per kernel (in launch order) the
    ``NCU_METRICS`` and the three largest stall reasons (warps stalled per issued instruction)."""
    import csv
    with open(path) as fh:
        lines = fh.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))[1:]  # the row after the header gives the units
    scale = {"ms": 1e-6, "dram MB": 1e-6, "local MB": 1e-6}
    table = []
    for r in rows:
        def num(metric):
            v = r.get(metric, "").replace(",", "")
            try:
                return float(v)
            except ValueError:
                return float("nan")
        entry = {"kernel": r["Kernel Name"][:48]}
        entry |= {k: num(m) * scale.get(k, 1.0) for k, m in NCU_METRICS.items()}
        stalls = sorted(((num(STALL_METRIC.format(s)), s) for s in STALLS), reverse=True)
        entry["stalls"] = {s: round(v, 2) for v, s in stalls[:3]}
        table.append(entry)
    cols = list(NCU_METRICS)
    print(f"{'kernel':48} " + " ".join(f"{c:>8}" for c in cols) + "  top stalls (warps per issue)")
    for e in table:
        print(f"{e['kernel']:48} " + " ".join(f"{e[c]:8.3f}" if c in ("ms",) else f"{e[c]:8.1f}" for c in cols)
              + "  " + ", ".join(f"{s} {v}" for s, v in e["stalls"].items()))
    if out:
        with open(out, "w") as fh:
            json.dump(table, fh, indent=1)


# ------------------------------------------------------------------------------------ correctness

CHECKS = {
    "bf16 K=V=128 l2norm tf32": dict(dtype="bf16", B=2, T=1000, H=16, K=128, V=128, l2=True),
    "bf16 K=V=128 l2norm safe tf32": dict(dtype="bf16", B=2, T=1000, H=16, K=128, V=128, l2=True, safe=-5.0),
    "fp16 K=V=128 l2norm tf32": dict(dtype="fp16", B=2, T=1000, H=16, K=128, V=128, l2=True),
    "bf16 varlen h0 safe keep": dict(dtype="bf16", B=1, T=1500, H=16, K=128, V=128, l2=True, safe=-5.0,
                                     lengths=[0, 300, 700, 0, 500], h0=True, knobs=dict(disable_recompute=True)),
    "fp32 K=V=100 ieee gather": dict(dtype="fp32", B=1, T=300, H=4, K=100, V=100, h0=True,
                                     knobs=dict(precision="ieee", use_gather=True)),
    "fp32 K=V=100 tf32x3 safe": dict(dtype="fp32", B=1, T=300, H=4, K=100, V=100, safe=-3.0,
                                     knobs=dict(precision="tf32x3")),
    "fp32 K=V=100 tf32 safe gather": dict(dtype="fp32", B=1, T=300, H=4, K=100, V=100, safe=-5.0,
                                          knobs=dict(precision="tf32", use_gather=True)),
    "fp16 K=60 V=192 gate-in-kernel": dict(dtype="fp16", B=1, T=200, H=4, K=60, V=192, gate=True),
    "bf16 K=V=256 sigmoid gate safe gather": dict(dtype="bf16", B=1, T=200, H=2, K=256, V=256, gate=True,
                                                  safe=-5.0, knobs=dict(use_gather=True)),
    "fp32 K=V=32 B=2 partial chunk": dict(dtype="fp32", B=2, T=197, H=2, K=32, V=32, h0=True,
                                          knobs=dict(precision="tf32x3")),
    # the serial passes over segments (``chunk.segments``), their scan included
    "bf16 varlen h0 segments of 4": dict(dtype="bf16", B=1, T=2000, H=4, K=128, V=128, l2=True, h0=True,
                                         lengths=[0, 900, 37, 1063], knobs=dict(segment_chunks=4)),
    "fp32 K=V=256 B=2 h0 segments of 2": dict(dtype="fp32", B=2, T=700, H=2, K=256, V=256, h0=True,
                                              knobs=dict(precision="tf32x3", segment_chunks=2)),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_one(name):
    """Errors of o, final state and every gradient of one ``CHECKS`` configuration vs float64."""
    c = CHECKS[name]
    dtype = DTYPES[c["dtype"]]
    lengths = c.get("lengths")
    x, cu = make_inputs(c["B"], c["T"], c["H"], c["K"], c["V"], lengths, dtype, seed=3,
                        gate="raw" if c.get("gate") else "logsigmoid")
    if c.get("safe") and not c.get("gate"):
        x["g"] = (x["g"].float() * (c["safe"] / LOWER_BOUND)).to(dtype)
    N = c["B"] if lengths is None else len(lengths)
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    extra = {}
    if c.get("h0"):
        extra["initial_state"] = torch.randn(N, c["H"], c["K"], c["V"], device=DEVICE, generator=gen)
    if c.get("gate"):
        extra["A_log"] = torch.randn(c["H"], device=DEVICE, generator=gen) * 0.5
        extra["dt_bias"] = torch.randn(c["H"] * c["K"], device=DEVICE, generator=gen) * 0.5
    opts = dict(cu_seqlens=cu, output_final_state=True, use_qk_l2norm=c.get("l2", False),
                safe_gate="safe" in c, lower_bound=c.get("safe"), use_gate_in_kernel=c.get("gate", False))
    names = list(x) + list(extra)
    leaves = {n: t.detach().requires_grad_() for n, t in {**x, **extra}.items()}
    t = time.perf_counter()
    o, ht = optimized.kda(**{n: leaves[n] for n in x}, **{n: leaves[n] for n in extra}, **opts, **c.get("knobs", {}))
    do = torch.randn(o.shape, device=DEVICE, generator=gen)
    dht = torch.randn(ht.shape, device=DEVICE, generator=gen)
    grads = torch.autograd.grad((o, ht), [leaves[n] for n in names], (do.to(o.dtype), dht))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t
    ref_leaves = {n: leaves[n].detach().double().requires_grad_() for n in names}
    ro, rht = references.kda_chunked(**ref_leaves, **opts)
    rgrads = torch.autograd.grad((ro, rht), [ref_leaves[n] for n in names], (do.double(), dht.double()))
    errs = {"o": rel(o, ro), "ht": rel(ht, rht)}
    errs.update({f"d{n}": rel(a, b) for n, a, b in zip(names, grads, rgrads)})
    finite = all(bool(torch.isfinite(v).all()) for v in (o, ht, *grads))
    return dict(name=name, seconds=secs, finite=finite, errors=errs)


def check(names, jobs):
    """Run each configuration in its own process, ``jobs`` at a time; print a table."""
    def run(name):
        p = subprocess.run([sys.executable, __file__, "--check-one", name], capture_output=True, text=True)
        try:
            return json.loads(p.stdout.strip().splitlines()[-1])
        except Exception:
            return dict(name=name, failed=(p.stdout[-300:] + p.stderr[-700:]))
    results = []
    with ThreadPoolExecutor(jobs) as pool:
        for r in pool.map(run, names):
            results.append(r)
            if "failed" in r:
                print(f"FAILED {r['name']}:\n{r['failed']}", flush=True)
                continue
            errs = " ".join(f"{k} {v:.1e}" for k, v in r["errors"].items())
            print(f"{r['name']:40} {r['seconds']:6.1f}s finite={r['finite']} {errs}", flush=True)
    return results


# ---------------------------------------------------------------------------------------- profile

SERIAL_LAUNCHES = (dict(), dict(BV=64, num_warps=8, num_stages=1), dict(BV=32, num_warps=8, num_stages=1),
                   dict(BV=32, num_warps=4, num_stages=2), dict(BV=32, num_warps=8, num_stages=2),
                   dict(BV=16, num_warps=4, num_stages=2), dict(BV=16, num_warps=4, num_stages=1),
                   dict(BV=64, num_warps=4, num_stages=1), dict(BV=64, num_warps=4, num_stages=2))
SEGMENTS = tuple(dict(segments=n) for n in ("auto", 16, 32, 64, 128))
"""The serial passes over segments of n chunks side by side (``chunk.segments``; "auto": ``segment_length``,
which is no split at B=8)."""
NARROW = tuple(dict(segments=n, BV=bv, num_warps=4, num_stages=2) for n in ("auto", 32) for bv in (32, 16))
"""Value blocks of 32 and 16 over the default segments (none at B=8 and varlen) and over segments of 32 chunks: whether a
narrower block (smaller dots, more programs) shortens a pass that waits on its longest sequence
(H100, at 0a0a52c: it does not)."""
POINTERS = (dict(TMA=False), dict(segments="auto", TMA=False))
"""The serial passes' default launches with their row blocks loaded through pointers, not TMA (``common.tma_operands``;
the gradients' state terms likewise: ``("grads", dict(TMA=False))``)."""
SCALE_BLOCKS = (dict(prepare=dict(SB=64)), dict(segments="auto", prepare=dict(SB=64)))
"""The prepared operands' row scales by column blocks of 64 (``chunk.prepared.SCALE_BLOCK`` is 128), by default
and over segments; the serial passes' own state blocks are the ``KB`` variants."""
PROFILE_VARIANTS = (
    [("intra", cfg, safe, False) for cfg in (
        dict(), dict(diag=dict(BK=16)), dict(diag=dict(BK=64)), dict(diag=dict(BK=128)), dict(diag=dict(num_warps=2)),
        dict(exact=dict(BH=1)), dict(exact=dict(num_warps=2)), dict(exact=dict(BH=4)),
        dict(exact=dict(BH=4, num_warps=2)), dict(exact=dict(BH=8, num_warps=4)), dict(exact=dict(maxnreg=128)),
        dict(inverse=dict(num_warps=2)),
        dict(below=dict(BK=32)), dict(below=dict(BK=64)), dict(below=dict(num_warps=2)), dict(below=dict(num_stages=1)),
        dict(below=dict(num_stages=3)), dict(diag=dict(maxnreg=128)), dict(diag=dict(BK=16, maxnreg=128)),
        dict(below=dict(maxnreg=192)), dict(below=dict(maxnreg=168)), dict(below=dict(maxnreg=128)))
     for safe in (False, True)]
    + [("recurrence", cfg, False, False) for cfg in SERIAL_LAUNCHES + SEGMENTS + NARROW + POINTERS + SCALE_BLOCKS
       + (dict(KB=128), dict(segments="auto", KB=128))]
    + [("recurrence_keep", cfg, False, False) for cfg in (dict(), dict(BV=64, num_warps=8, num_stages=1))]
    + [("dstate", cfg, False, False) for cfg in SERIAL_LAUNCHES + SEGMENTS + NARROW + POINTERS + SCALE_BLOCKS
       + (dict(KB=128), dict(segments="auto", KB=128))]
    + [("recurrence_from_forward", cfg, False, False) for cfg in SEGMENTS + NARROW + POINTERS[1:] + SCALE_BLOCKS[1:]
       + (dict(segments="auto", KB=64),)]
    + [("dstate_from_forward", cfg, False, False) for cfg in SEGMENTS + NARROW + POINTERS[1:] + SCALE_BLOCKS[1:]
       + (dict(segments="auto", KB=128),)]
    + [("grads", cfg, safe, False) for cfg in (dict(), dict(num_stages=1), dict(num_warps=8), dict(BK=16),
                                               dict(BK=64), dict(BV=64, num_stages=2), dict(BV=16), dict(TMA=False))
       for safe in (False, True)]
    + [("grads", dict(diag=dict(num_warps=w)), False, False) for w in (1, 4)]
    + [("grads", dict(pairs=cfg), safe, False) for cfg in (dict(maxnreg=None), dict(maxnreg=128), dict(maxnreg=192),
                                                           dict(num_warps=1, maxnreg=None), dict(num_warps=4),
                                                           dict(num_warps=8), dict(num_stages=1), dict(num_stages=3))
       for safe in (False, True)]
    + [("grads", dict(BK=64, pairs=dict(maxnreg=None)), safe, False) for safe in (False, True)]
    + [("grads", dict(value=cfg), False, False) for cfg in (dict(num_warps=8), dict(BV=32), dict(BV=32, num_stages=2),
                                                           dict(BV=32, num_warps=8), dict(num_stages=2))]
    + [("prepare_with_q", cfg, False, False) for cfg in (dict(), dict(num_warps=2), dict(num_warps=4),
                                                          *SCALE_BLOCKS[:1])]
    + [("front", cfg, False, False) for cfg in (dict(), dict(num_warps=4), dict(num_warps=16), dict(num_stages=2),
                                                 dict(maxnreg=128), dict(read_gate=True))]
    + [("gate", dict(), False, False)]
)


def profile_data(name):
    """Inputs and every intermediate of one shape (its dtype, l2-normalized q/k), for timing stages alone."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda import chunk_bwd, chunk_fwd
    from refcheck.optimized.kda.front import front
    s = SHAPES[name]
    x, cu = shape_inputs(name)
    flat = {n: t.reshape(s["B"] * s["T"], *t.shape[2:]).contiguous() for n, t in x.items()}
    ch = make_chunks(s["B"], s["T"], cu, CHUNK, flat["q"].device)
    scale = s["K"] ** -0.5
    q, k, _, G, flags = front(flat["q"], flat["k"], flat["g"], True, ch, "tf32", False)
    T, P = chunk_fwd.intra(q, k, G, flat["beta"], ch, scale, flags, "tf32", unit_rows=True)
    keys = prepare_keys(k, G, ch, "tf32", q=q)
    _, hs, U, _ = chunk_fwd.recurrence(keys, flat["v"], G, flat["beta"], T, None, ch, "tf32", final=False, scaled=True)
    do = torch.randn_like(flat["v"])
    dh, dY, _ = chunk_bwd.dstate(keys, G, flat["beta"], T, P, do, None, ch, scale, "tf32", False, scaled=True)
    return dict(flat=flat, ch=ch, q=q, k=k, G=G, T=T, P=P, flags=flags, keys=keys, hs=hs, U=U, do=do, dh=dh, dY=dY,
                scale=scale)


def profile_stage(d, stage, cfg, safe, gather):
    """A no-argument callable running one kernel stage on the data of ``profile_data``."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.chunk.segments import segment_length, split
    from refcheck.optimized.kda import chunk_bwd, chunk_fwd, gate
    from refcheck.optimized.kda.front import front
    f, ch, sc = d["flat"], d["ch"], d["scale"]
    cfg = dict(cfg)
    prep = cfg.pop("prepare", None)  # the prepared operands' launch (``SB``: their scales' column blocks)
    keys = d["keys"] if prep is None else prepare_keys(d["k"], d["G"], ch, "tf32", q=d["q"], config=prep)
    n = cfg.pop("segments", 0)
    n = segment_length(ch, d["k"].shape[1], f["v"].shape[-1]) if n == "auto" else n
    segs = split(ch, n) if n else None
    if stage == "intra":
        return lambda: chunk_fwd.intra(d["q"], d["k"], d["G"], f["beta"], ch, sc, None if safe else d["flags"], "tf32",
                                       unit_rows=True, config=cfg)
    # the forward's segment maps and entry states, for the backward's passes over the same segments
    trans = (chunk_fwd.recurrence(keys, f["v"], d["G"], f["beta"], d["T"], None, ch, "tf32", final=False,
                                  segments=segs)[3] if segs is not None and stage.endswith("_from_forward") else None)
    if stage == "recurrence_from_forward":  # the backward's recomputation over segments: step 3 alone
        return lambda: chunk_fwd.recurrence(prepare_keys(d["k"], d["G"], ch, "tf32", config=prep), f["v"], d["G"],
                                            f["beta"], d["T"], None, ch, "tf32", final=False, scaled=True,
                                            segments=segs, transitions=trans, config=cfg)
    if stage.startswith("recurrence"):  # the forward's pass with its output (keep: the states and U stored, fp32)
        keep = stage == "recurrence_keep"
        o = torch.empty_like(f["v"])
        return lambda: chunk_fwd.recurrence(keys, f["v"], d["G"], f["beta"], d["T"], None, ch, "tf32", final=not keep,
                                            segments=segs, config=cfg, output=(d["P"], o, sc), states=keep)
    if stage.startswith("dstate"):  # alone, or with the forward's segment maps (step 1 on the values alone)
        return lambda: chunk_bwd.dstate(keys, d["G"], f["beta"], d["T"], d["P"], d["do"], None, ch, sc, "tf32",
                                        False, scaled=True, segments=segs, transitions=trans, config=cfg)
    if stage == "grads":
        return lambda: chunk_bwd.grads(d["q"], d["k"], f["v"], f["g"], d["G"], f["beta"], d["hs"], d["dh"], d["U"],
                                       d["dY"], d["do"], None, None, None, ch, sc, None if safe else d["flags"],
                                       gather, "tf32", f["q"].dtype, f["k"].dtype, cfg)
    if stage == "prepare_with_q":  # the backward's operands (with q e^G)
        return lambda: prepare_keys(d["k"], d["G"], ch, "tf32", q=d["q"], config=(prep or {}) | cfg)
    if stage == "gate":
        return lambda: gate.gate_cumsum(f["g"], None, None, None, ch)
    # the forward's: G from g (``read_gate``: G given, as the gate's kernel forms it), q and k normalized, k's operands,
    # the output's left operand
    assert stage == "front", stage
    G = d["G"] if cfg.pop("read_gate", False) else None
    return lambda: front(f["q"], f["k"], f["g"], True, ch, "tf32", safe, cfg, G=G)


def profile(names, jobs, stages=None, defaults=False):
    """Compile every variant (of ``stages``, default all; with ``defaults`` only each stage's default launch, and
    the serial passes' default segments, TMA or not) in parallel processes, then time each here."""
    from refcheck.optimized.common import launch_only
    todo = [i for i, v in enumerate(PROFILE_VARIANTS) if (stages is None or v[0] in stages)
            and (not defaults or launch_only(v[1]) in (dict(), dict(segments="auto")))]
    data = profile_data(names[0])  # compiles the default launches once, before the parallel compiles
    bench_util.warm(__file__, [[str(i)] for i in todo], jobs, flag="--profile-one")
    from triton.testing import do_bench
    for name in names:
        d = data if name == names[0] else profile_data(name)
        for stage, cfg, safe, gather in (PROFILE_VARIANTS[i] for i in todo):
            if not name.startswith("B8_T4096") and stage not in ("recurrence", "dstate", "recurrence_from_forward",
                                                                 "dstate_from_forward"):
                continue
            try:
                ms = do_bench(profile_stage(d, stage, cfg, safe, gather), return_mode="median")
                print(f"{name:16} {stage:16} safe={safe!s:5} gather={gather!s:5} {cfg} {ms:8.3f} ms", flush=True)
            except Exception as err:
                print(f"{name:16} {stage:16} {cfg} failed: {type(err).__name__}: {str(err)[:200]}", flush=True)
        del d
        data = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--shapes", nargs="*", choices=list(SHAPES),
                    help="the shapes to time (default: all) or to profile (default: B8_T4096 B1_T32768)")
    ap.add_argument("--check", action="store_true", help="correctness table instead of timing")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--profile", action="store_true", help="time each kernel stage under several launches")
    ap.add_argument("--stages", nargs="*", help="--profile: only these stages (intra, recurrence, dstate, ...)")
    ap.add_argument("--defaults", action="store_true", help="--profile: only the default launches")
    ap.add_argument("--kernels", action="store_true",
                    help="CUDA time of each kernel, forward and forward+backward, ours and FLA's (--shapes)")
    ap.add_argument("--ours-only", action="store_true", help="--kernels: without FLA")
    ap.add_argument("--ncu-step", action="store_true", help="the profiled step of ncu (see the module docstring)")
    ap.add_argument("--ncu-metrics", action="store_true", help="print the metrics ncu is to collect")
    ap.add_argument("--ncu-table", help="tabulate an ncu --csv --page raw file of --ncu-step (JSON with --out)")
    ap.add_argument("--check-one", help=argparse.SUPPRESS)
    ap.add_argument("--profile-one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--warm-one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ncu_metrics:
        print(ncu_metrics())
    elif args.ncu_step:
        ncu_step()
    elif args.ncu_table:
        ncu_table(args.ncu_table, args.out)
    elif args.warm_one:
        warm_one(args.warm_one[0], args.warm_one[1] == "True")
    elif args.profile_one is not None:
        stage, cfg, safe, gather = PROFILE_VARIANTS[args.profile_one]
        profile_stage(profile_data("B8_T4096" if DEVICE == "cuda" else "tiny"), stage, cfg, safe, gather)()
    elif args.profile:
        profile(args.shapes or ["B8_T4096", "B1_T32768"], args.jobs, args.stages, args.defaults)
    elif args.kernels:
        kernels(args.shapes or ["B1_T32768"], args.out, args.jobs, args.ours_only)
    elif args.check_one:
        print(json.dumps(check_one(args.check_one)))
    elif args.check:
        check(list(CHECKS), args.jobs)
    elif bench(args.shapes or list(TIMED), args.out, args.jobs):
        sys.exit(1)


if __name__ == "__main__":
    main()
