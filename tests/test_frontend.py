"""Every launch of our ops passes the Triton compiler's front end for sm_90, on the CPU
(``refcheck.runtime.frontend``): a kernel the interpreter runs is one the GPU's compiler accepts.

The launches of one forward + backward per configuration (input dtypes, precision modes, safe_gate,
head dims that are not powers of two) are captured in a process of their own, where the kernels are
compiled ones (this process interprets them), and each distinct launch goes through the front end. A
planted kernel whose loop-carried tile changes dtype shows that the check can fail: the fault the
interpreter ran and a GPU law run refused (H100; its summary in ``benchmarks/results`` as of 523aefc).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl
    from refcheck import optimized
    from refcheck.runtime.frontend import capture, frontend_errors

    @triton.jit
    def loop_dtype_changes(x_ptr, out_ptr, N):
        acc = tl.zeros((16,), tl.float32)
        for i in range(N):
            acc = tl.maximum(acc, tl.load(x_ptr + i * 16 + tl.arange(0, 16)))   # fp64 x: acc becomes fp64
        tl.store(out_ptr + tl.arange(0, 16), acc)

    def grad(*tensors):
        return [t.requires_grad_() for t in tensors]

    def kda(dtype, K, V, **knobs):
        def run():
            q, k, v = grad(torch.randn(1, 70, 2, K, dtype=dtype), torch.randn(1, 70, 2, K, dtype=dtype),
                           torch.randn(1, 70, 2, V, dtype=dtype))
            g = grad(F.logsigmoid(torch.randn(1, 70, 2, K)).to(dtype))[0]
            beta = grad(torch.rand(1, 70, 2, dtype=dtype))[0]
            o, ht = optimized.kda(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True, **knobs)
            (o.float().sum() + ht.sum()).backward()
        return run

    def linear(op, dtype, K, V, **knobs):
        def run():
            q, k, v = grad(torch.randn(1, 140, 2, K, dtype=dtype), torch.randn(1, 140, 2, K, dtype=dtype),
                           torch.randn(1, 140, 2, V, dtype=dtype))
            g = grad(F.logsigmoid(torch.randn(1, 140, 2, K) if op == "gla" else torch.randn(1, 140, 2)))[0]
            o, ht = getattr(optimized, op)(q, k, v, g, output_final_state=True, **knobs)
            (o.float().sum() + ht.sum()).backward()
        return run

    def gdn(dtype, K, V, **knobs):
        def run():   # grouped value heads (2 query/key heads, 4 value heads), the gate's function in the kernel
            q, k = grad(torch.randn(1, 70, 2, K, dtype=dtype), torch.randn(1, 70, 2, K, dtype=dtype))
            v = grad(torch.randn(1, 70, 4, V, dtype=dtype))[0]
            a, beta, A_log, dt_bias = grad(torch.randn(1, 70, 4), torch.rand(1, 70, 4), torch.randn(4), torch.randn(4))
            o, ht = optimized.gated_delta_rule_chunk(q, k, v, a, beta, output_final_state=True, use_qk_l2norm=True,
                                                     use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, **knobs)
            (o.float().sum() + ht.sum()).backward()
        return run

    def attention(dtype, D, **knobs):
        def run():
            q, k, v = grad(*(torch.randn(1, 130, 2, D, dtype=dtype) for _ in range(3)))
            o, _ = optimized.attention(q, k, v, **knobs)
            o.float().sum().backward()
        return run

    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    cases = {
        "planted": lambda: loop_dtype_changes[(1,)](torch.zeros(64, dtype=torch.float64), torch.zeros(16), 4),
        "kda fp32 split": kda(f32, 128, 128, segment_chunks=1), "kda fp32 ieee": kda(f32, 60, 100, precision="ieee"),
        "kda fp32 tf32x3 safe": kda(f32, 128, 128, precision="tf32x3", safe_gate=True, lower_bound=-5.0),
        "kda bf16": kda(bf16, 128, 128), "kda bf16 safe keep": kda(bf16, 128, 128, safe_gate=True, lower_bound=-5.0,
                                                                 disable_recompute=True),
        "kda fp16 K=60 V=192 split": kda(f16, 60, 192, segment_chunks=1),
        "gla fp32": linear("gla", f32, 128, 128), "gla bf16 C=128": linear("gla", bf16, 100, 64, chunk_size=128),
        "simple_gla fp32 tf32x3": linear("simple_gla", f32, 64, 64, precision="tf32x3"),
        "simple_gla bf16": linear("simple_gla", bf16, 128, 128),
        "gdn bf16": gdn(bf16, 128, 128), "gdn fp32 ieee K=60 V=100 split": gdn(f32, 60, 100, precision="ieee",
                                                                               segment_chunks=1),
        "attention bf16 causal": attention(bf16, 128, causal=True), "attention fp32": attention(f32, 96),
    }
    out = {}
    for name, run in cases.items():
        launches = capture(run)
        out[name] = dict(launches=len(launches), errors=[[k, {n: str(v) for n, v in c.items()}, e[-800:]]
                                                         for k, c, e in frontend_errors(launches)])
    print(json.dumps(out))
''')


def test_every_launch_passes_the_compiler_front_end(tmp_path):
    script = tmp_path / "frontend_cases.py"   # a file: @triton.jit reads its kernels' source
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    planted = result.pop("planted")
    assert planted["launches"] == 1 and "Loop-carried variable" in planted["errors"][0][2], planted
    for name, r in result.items():
        assert r["launches"] >= 3, f"{name}: only {r['launches']} launches captured (the op failed before them?)"
    failed = {name: r["errors"] for name, r in result.items() if r["errors"]}
    assert not failed, json.dumps(failed, indent=1)
