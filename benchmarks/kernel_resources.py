"""Registers, spills and shared memory of every kernel of ours on Hopper, without a GPU.

    python benchmarks/kernel_resources.py [--op kda|gla|simple_gla|attention|gated_delta_rule] [--shape B8_T4096]
        [--arch 90] [--safe] [--heads 16,32]
        [--dims 192,128] [--causal] [--schedule grid|persistent] [--dtype fp32] [--precision tf32x3] [--fit]
        [--sass DIR]

Runs one of our ops (``optimized.kda`` by default) forward and backward on small CPU tensors with every Triton launch captured
instead of run (``JITFunction.run`` is replaced), then compiles each captured launch for
``sm_<arch>`` with the ptxas that ships with Triton and reads the cubin's resource usage
(``cuobjdump -res-usage``). The launch configuration is the one the wrapper would pick for the
given shape's head dims and program counts, so a register or spill figure here is the one the GPU
sees, up to differences between this Triton and the GPU's (3.9 here, 3.6 on the lent machines).

``--fit`` compiles each launch as it is made and refuses those that need more shared memory than an
H100 or H200 has, so that the launch ladders fall back as they do on the GPU: a kernel whose every step
is refused is an ``OutOfResources`` on valid input, found without a GPU (the compiler's figures here
match the GPU's: fp32 attention at Dqk=89, Dv=128, "tf32x3" needed 320000 and 245760 B in both).

A kernel at 255 registers with a non-zero STACK spills to local memory every iteration. Use this to
iterate on register pressure offline and spend GPU time on timing only; but spills are not always what
sets a kernel's time (KDA's serial passes: fewer spills measured slower where they cost reductions on the
dependent chain, ``docs/kernels/kda.md``). ``--sass DIR`` writes each launch's SASS and Triton GPU IR, to
see where a loop's loads, barriers and shared-memory round trips sit. With the GPU's Triton put first on ``PYTHONPATH``
(``pip install --no-deps --target /tmp/tr36 triton==3.6.0``) it also shows that every kernel
compiles there.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
                torch.int64: "i64"}


def capture(fn, fit: int | None = None, arch: int = 90):
    """Call ``fn()`` with Triton launches recorded, not run (``refcheck.runtime.frontend.capture``).
    ``fit``: the shared memory of the GPU in bytes; each launch is then compiled for ``sm_<arch>`` as it
    comes and refused where it needs more, so that the launch ladders (``common.launch``) fall back as
    on that GPU; the refused launches are recorded with ``options["refused"]`` set to the bytes they needed."""
    from refcheck.runtime import frontend

    def refuse(kernel, bound, options):
        shared = resources(kernel, bound, options, arch)["shared"]
        return shared if shared > fit else None
    return frontend.capture(fn, refuse if fit is not None else None)


def resources(kernel, bound, options, arch: int, sass: str | None = None) -> dict:
    """Registers, stack and shared memory of one launch compiled for ``sm_<arch>``; ``sass``: also write
    the kernel's SASS (``cuobjdump -sass``) to this file, and its Triton GPU IR beside it (``.ttgir``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from refcheck.runtime.frontend import specialize
    sig, consts, attrs, opts = specialize(kernel, bound, options, arch)
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", arch, 32), options=opts)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    path = f"/tmp/refcheck_{kernel.fn.__name__}_{os.getpid()}.cubin"
    with open(path, "wb") as fh:
        fh.write(compiled.asm["cubin"])
    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", path], capture_output=True,
                           text=True).stdout
    if sass:
        with open(sass, "w") as fh:
            fh.write(subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path], capture_output=True,
                                    text=True).stdout)
        with open(os.path.splitext(sass)[0] + ".ttgir", "w") as fh:
            fh.write(compiled.asm["ttgir"])
    os.unlink(path)
    fields = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    return dict(kernel=kernel.fn.__name__, regs=int(fields.get("REG", -1)), stack=int(fields.get("STACK", -1)),
                shared=compiled.metadata.shared, options=opts)


def kda_launches(shape: dict, safe: bool, keep: bool, fit: int | None = None, dtype=torch.bfloat16,
                 segments: bool = False):
    """Every launch of one forward + backward of ``optimized.kda`` (inputs in ``dtype``, l2norm) for ``shape``.

    Launches are recorded, not run, so outputs hold garbage; the wrappers' choices depend on head
    dims and program counts only, so one chunk per sequence of the shape's (B, H, K, V) gives the
    same launches as the full length. ``segments``: two chunks per sequence in segments of one
    (``segment_chunks=1``), the launches of the serial passes over segments (``chunk.segments``)."""
    from refcheck import optimized
    B, H, K, V = (shape[n] for n in "BHKV")
    T = 128 if segments else 64

    def rnd(*s):
        return torch.randn(*s, dtype=dtype).requires_grad_()

    def fwd_bwd():
        g = torch.randn(B, T, H, K).sigmoid().log().to(dtype).requires_grad_()
        o, ht = optimized.kda(rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, H, V), g, rnd(B, T, H).sigmoid(),
                              use_qk_l2norm=True, output_final_state=True, safe_gate=safe,
                              lower_bound=-5.0 if safe else None, disable_recompute=keep,
                              segment_chunks=1 if segments else 0)
        (o.float().sum() + ht.sum()).backward()
    return capture(fwd_bwd, fit)


def gated_delta_rule_launches(heads: tuple[int, int], K: int, V: int, fit: int | None = None, dtype=torch.bfloat16,
                              B: int = 8):
    """Every launch of one forward + backward of ``optimized.gated_delta_rule_chunk`` as Qwen3.5's layers call it
    (``heads = (H, HV)`` query/key and value heads, the gate's function and l2norm in the kernel, a final state),
    one chunk per sequence (launches depend on head dims and program counts only)."""
    from refcheck import optimized
    H, HV = heads

    def fwd_bwd():
        q, k, v = _grad_inputs((B, 64, H, K), (B, 64, H, K), (B, 64, HV, V), dtype=dtype)
        a, beta = _grad_inputs((B, 64, HV), (B, 64, HV), dtype=dtype)
        A_log, dt_bias = _grad_inputs((HV,), (HV,), dtype=torch.float32)
        o, ht = optimized.gated_delta_rule_chunk(q, k, v, a, beta.sigmoid(), A_log=A_log, dt_bias=dt_bias,
                                                 use_gate_in_kernel=True, use_qk_l2norm=True, output_final_state=True)
        (o.float().sum() + ht.sum()).backward()
    return capture(fwd_bwd, fit)


def _grad_inputs(*shapes, dtype=torch.bfloat16):
    return [torch.randn(*s, dtype=dtype).requires_grad_() for s in shapes]


def linear_launches(op: str, shape: dict, dtype=torch.bfloat16, fit: int | None = None, **knobs):
    """Every launch of one forward + backward of ``optimized.gla`` or ``optimized.simple_gla`` (final
    state, ``knobs`` such as precision and chunk_size) at the shape's head dims, one chunk per
    sequence (launches depend on head dims and program counts only)."""
    from refcheck import optimized
    B, H, K, V = (shape[n] for n in "BHKV")

    def fwd_bwd():
        q, k, v = _grad_inputs((B, 64, H, K), (B, 64, H, K), (B, 64, H, V), dtype=dtype)
        g = torch.randn(B, 64, H, K) if op == "gla" else torch.randn(B, 64, H)
        g = F.logsigmoid(g).requires_grad_()
        o, ht = getattr(optimized, op)(q, k, v, g, output_final_state=True, **knobs)
        (o.float().sum() + ht.sum()).backward()
    return capture(fwd_bwd, fit)


def attention_launches(causal: bool, dims: tuple[int, int], schedule: str = "grid", dtype=torch.bfloat16,
                       fit: int | None = None, **knobs):
    """Every launch of one forward + backward of ``optimized.attention`` (H = Hk = 16) at head dims
    ``dims = (Dqk, Dv)``, the forward under ``schedule``, more ``knobs`` (precision); ``fit`` as in ``capture``."""
    from refcheck import optimized
    dqk, dv = dims

    def fwd_bwd():
        q, k, v = _grad_inputs((1, 128, 16, dqk), (1, 128, 16, dqk), (1, 128, 16, dv), dtype=dtype)
        o, lse = optimized.attention(q, k, v, causal=causal, schedule=schedule, **knobs)
        o.float().sum().backward()
    return capture(fwd_bwd, fit)


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kda import SHAPES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="kda", choices=("kda", "gla", "simple_gla", "attention", "gated_delta_rule"))
    ap.add_argument("--shape", default="B8_T4096", choices=list(SHAPES), help="kda, gla, simple_gla: head dims and batch")
    ap.add_argument("--dims", default="192,128", help="attention: Dqk,Dv")
    ap.add_argument("--causal", action="store_true", help="attention: causal")
    ap.add_argument("--schedule", default="grid", choices=("grid", "persistent"), help="attention: the forward's schedule")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--safe", action="store_true", help="kda: safe_gate with lower_bound -5")
    ap.add_argument("--keep", action="store_true", help="kda: disable_recompute")
    ap.add_argument("--segments", action="store_true", help="kda: the serial passes over segments (segment_chunks=1)")
    ap.add_argument("--warps", type=int, help="compile every kernel with this many warps instead")
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"), help="input dtype")
    ap.add_argument("--precision", help="the precision knob (gla, simple_gla, attention)")
    ap.add_argument("--chunk-size", type=int, help="gla, simple_gla: the chunk_size knob")
    ap.add_argument("--kv", help="kda, gla, simple_gla, gated_delta_rule: head dims K,V instead of the shape's")
    ap.add_argument("--heads", default="16,32",
                    help="gated_delta_rule: query/key and value heads H,HV (default Qwen3.5's 16,32; its TP8 slice 2,8)")
    ap.add_argument("--fit", type=int, nargs="?", const=232448,
                    help="compile each launch as it comes and let the launch ladders fall back as on a GPU with this "
                         "much shared memory (default 232448 B, an H100 or H200); refused steps are listed")
    ap.add_argument("--sass", metavar="DIR",
                    help="also write each launch's SASS and Triton GPU IR to DIR/<n>_<kernel>.sass, .ttgir")
    args = ap.parse_args()
    shape = dict(SHAPES[args.shape])
    if args.kv:
        shape["K"], shape["V"] = (int(d) for d in args.kv.split(","))
    if args.op == "kda":
        launches = kda_launches(shape, args.safe, args.keep, args.fit, DTYPES[args.dtype], args.segments)
    elif args.op == "gated_delta_rule":
        h, hv = (int(n) for n in args.heads.split(","))
        launches = gated_delta_rule_launches((h, hv), shape["K"], shape["V"], args.fit, DTYPES[args.dtype], shape["B"])
    elif args.op == "attention":
        dqk, dv = (int(d) for d in args.dims.split(","))
        knobs = {"precision": args.precision} if args.precision else {}
        launches = attention_launches(args.causal, (dqk, dv), args.schedule, DTYPES[args.dtype], args.fit, **knobs)
    else:
        knobs = {n: v for n, v in (("precision", args.precision), ("chunk_size", args.chunk_size)) if v is not None}
        launches = linear_launches(args.op, shape, DTYPES[args.dtype], args.fit, **knobs)
    import triton

    from refcheck.runtime.frontend import constexprs
    print(f"triton {triton.__version__}, sm_{args.arch}")
    print(f"{'kernel':22} {'regs':>5} {'stack':>6} {'shared':>7}  options")
    if args.sass:
        os.makedirs(args.sass, exist_ok=True)
    for n, (kernel, bound, options) in enumerate(launches):
        consts = constexprs(kernel, bound)
        if "refused" in options:
            print(f"{kernel.fn.__name__:22} refused: needs {options['refused']} B of shared memory  {options} {consts}")
            continue
        if args.warps:
            options = options | dict(num_warps=args.warps)
        r = resources(kernel, bound, options, args.arch,
                      args.sass and os.path.join(args.sass, f"{n:02}_{kernel.fn.__name__}.sass"))
        print(f"{r['kernel']:22} {r['regs']:5} {r['stack']:6} {r['shared']:7}  {r['options']} {consts}", flush=True)


if __name__ == "__main__":
    main()
