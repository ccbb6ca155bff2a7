"""Probe: KDA's forward at B=8 by sequence groups, each group's stages on a stream of its own (scratch).

The chunk-parallel stages (gate, front, intra) of a later group run beside the serial pass of an earlier one, which
at fewer sequences leaves SMs free. Prints do_bench medians (ms) and o's largest difference from the one-stream run.
Measured on an H200 (3b3d031, ``benchmarks/results/kda_pipeline_probe_h200.txt``): every split slower, the host's
queueing of each group's launches the bound (not kept).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kda import make_inputs  # noqa: E402

from refcheck.optimized.common import make_chunks  # noqa: E402
from refcheck.optimized.kda.chunk_fwd import CHUNK, intra, recurrence  # noqa: E402
from refcheck.optimized.kda.front import front  # noqa: E402

B, T, H, K, V = 8, 4096, 16, 128, 128
PREC = "tf32"


def stages(q, k, v, g, beta, o, ht, nseq, config=None, mark=None):
    chunks = make_chunks(nseq, T, None, CHUNK, q.device)
    qn, kn, keys, G, flags = front(q, k, g, True, chunks, PREC, False)
    Tm, P = intra(qn, kn, G, beta, chunks, K ** -0.5, flags, PREC, unit_rows=True)
    if mark is not None:
        mark.record()
    fin, *_ = recurrence(keys, v, G, beta, Tm, None, chunks, PREC, final=True, output=(P, o, K ** -0.5), states=False,
                         config=config)
    ht.copy_(fin)


def main():
    from triton.testing import do_bench
    x, _ = make_inputs(B, T, H, K, V, None, torch.bfloat16)
    q, k, v, g = (x[n].reshape(B * T, H, -1).contiguous() for n in "qkvg")
    beta = x["beta"].reshape(B * T, H).contiguous()
    streams = [torch.cuda.Stream() for _ in range(8)]

    def run(groups, stagger, config=None):
        o = torch.empty_like(v)
        ht = torch.empty(B, H, K, V, device=v.device)
        n = B // groups
        main_stream = torch.cuda.current_stream()
        done = []
        prev = None
        for i in range(groups):
            s = streams[i]
            s.wait_stream(main_stream)
            if stagger and prev is not None:
                s.wait_event(prev)
            with torch.cuda.stream(s):
                rows = slice(i * n * T, (i + 1) * n * T)
                prev = torch.cuda.Event()
                stages(q[rows], k[rows], v[rows], g[rows], beta[rows], o[rows], ht[i * n:(i + 1) * n], n, config,
                       prev)
            done.append(s)
        for s in done:
            main_stream.wait_stream(s)
        return o, ht

    ref_o, ref_ht = run(1, False)
    torch.cuda.synchronize()
    rows = []
    for groups in (1, 2, 4, 8):
        for stagger in (False, True) if groups > 1 else (False,):
            for cfg in (None, dict(BV=64, num_warps=4, num_stages=1)) if groups > 1 else (None,):
                o, ht = run(groups, stagger, cfg)
                torch.cuda.synchronize()
                diff = max((o.float() - ref_o.float()).abs().max().item(), (ht - ref_ht).abs().max().item())
                ms = do_bench(lambda: run(groups, stagger, cfg), return_mode="median")
                rows.append(f"groups {groups} stagger {stagger!s:5} BV64 {cfg is not None!s:5}: {ms:.3f} ms  "
                            f"max|o, ht - one stream| {diff:.2e}")
                print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
