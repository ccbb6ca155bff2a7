"""Probe: does Triton's automatic warp specialization (``tl.range(..., warp_specialize=True)``) with tensor-
descriptor (TMA) loads pay for a FlashAttention forward on this GPU?

    python benchmarks/attention_ws_probe.py [--out probe.json]

A minimal non-causal forward (one program per 128 or 64 query rows of one (batch, head), K/V loaded through
host-side ``TensorDescriptor`` s of ``[B*H*T, D]``), bf16, B=8 H=16 T=2048 D=128, timed under several
settings against ``optimized.attention`` at the same shape and checked against SDPA. Offline (sm_90), the
specialization is applied under Triton 3.6 at 4 warps (12 in all), not at 8, and fails to compile at 4 under
Triton 3.9; so the probe asks the GPU's Triton whether the schedule is worth building into our kernel.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@triton.jit
def probe_kernel(q_desc, k_desc, v_desc, o_desc, T, qk_scale, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                 WS: tl.constexpr):
    row0 = tl.program_id(1) * T
    q = q_desc.load([row0 + tl.program_id(0) * BM, 0])
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for j in tl.range(0, T, BN, warp_specialize=WS):
        s = tl.dot(q, tl.trans(k_desc.load([row0 + j, 0])))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.bfloat16), v_desc.load([row0 + j, 0]), acc * alpha[:, None])
        m = m_new
    o_desc.store([row0 + tl.program_id(0) * BM, 0], (acc / l[:, None]).to(tl.bfloat16))


SETTINGS = [dict(WS=ws, BM=bm, BN=bn, num_warps=w, num_stages=s)
            for ws, w in ((False, 8), (False, 4), (True, 4)) for bm in (128, 64) for bn in (64, 128) for s in (2, 3)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    from triton.testing import do_bench

    from refcheck import optimized
    B, H, T, D = 8, 16, 2048, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * B * H * T * T * D
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    ours = lambda: optimized.attention(q, k, v)  # noqa: E731
    rows = [dict(impl="ours", ms=do_bench(ours, return_mode="median"))]
    flat = [x.transpose(1, 2).reshape(B * H * T, D).contiguous() for x in (q, k, v)]
    o = torch.empty_like(flat[0])
    for cfg in SETTINGS:
        c = dict(cfg)
        bm, bn = c.pop("BM"), c.pop("BN")
        descs = [TensorDescriptor.from_tensor(x, [bm if n in (0, 3) else bn, D]) for n, x in enumerate((*flat, o))]
        run = lambda: probe_kernel[(T // bm, B * H)](*descs, T, D ** -0.5 * 1.4426950408889634, BM=bm, BN=bn, D=D, **c)  # noqa: E731
        row = dict(impl="probe", **cfg)
        try:
            run()
            torch.cuda.synchronize()
            err = ((o.view(B, H, T, D).transpose(1, 2).float() - ref.float()).norm() / ref.float().norm()).item()
            row.update(ms=do_bench(run, return_mode="median"), err_vs_sdpa=err)
        except Exception as e:
            row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        rows.append(row)
    for r in rows:
        r["tflops"] = flops / r["ms"] / 1e9 if "ms" in r else None
        print({n: (round(x, 4) if isinstance(x, float) else x) for n, x in r.items()}, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), triton=triton.__version__, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
