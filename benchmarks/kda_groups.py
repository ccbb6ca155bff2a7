"""The KDA backward over packed sequences of different lengths, with and without its sequence groups.

    python benchmarks/kda_groups.py [--shape varlen8_T32768] [--fractions 0.5 0.625 0.75 0.875]

``chunk.state.sequence_groups`` runs the backward's serial passes of the long sequences (more than ``state.LONG`` of
the longest's chunks) and those of the others as launches on streams of their own, the short ones' gradients while
the long ones' passes go on (``kda.api``; the forward has none: its output is formed in its serial pass). This
times ``optimized.kda``'s forward+backward (bf16, ``benchmarks/kda.py``'s inputs and timing, safe_gate off and on;
median, three runs) without groups and at each fraction, in one process.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kda as bench  # noqa: E402

from refcheck import optimized  # noqa: E402
from refcheck.optimized.chunk import state  # noqa: E402
from refcheck.optimized.kda import api  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="varlen8_T32768", choices=list(bench.SHAPES))
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.5, 0.625, 0.75, 0.875])
    args = ap.parse_args()
    x, cu = bench.shape_inputs(args.shape)
    grouped, default = api.sequence_groups, state.LONG
    for safe in (False, True):
        for fraction in (None, *args.fractions):
            api.sequence_groups = (lambda chunks: None) if fraction is None else grouped
            state.LONG = default if fraction is None else fraction
            runs = [bench.time_impl(optimized.kda, x, cu, safe, backward=True) for _ in range(3)]
            label = "no groups" if fraction is None else f"LONG={fraction}"
            print(f"{args.shape} forward+backward safe_gate={safe!s:5} {label:12} "
                  + " ".join(f"{ms:.3f}" for ms in runs) + " ms", flush=True)
    api.sequence_groups, state.LONG = grouped, default


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("kda_groups.py times CUDA kernels: no GPU here")
    main()
