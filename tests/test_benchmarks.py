"""The GPU benchmarks' own code on the CPU: each stage ``benchmarks/kda.py --profile`` times runs once, at its default
launch, on the tiny shape under the faithful interpreter. A change to a kernel's Python interface that a benchmark
calls then fails here, not in a GPU run's first call (where device time is short)."""
from __future__ import annotations

import importlib
import pathlib
import sys

from refcheck.runtime import interpreter

interpreter.interpret_new_kernels()  # before the kernel modules are imported

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def test_kda_profile_stages_run_at_their_default_launches(monkeypatch):
    """Every stage of ``PROFILE_VARIANTS`` (the forward's front, intra and passes, the backward's passes and gradients,
    the gate, the preparation) at its default launch, on ``profile_data("tiny")`` (one sequence of 70 tokens, one
    head: a whole chunk and a partial one)."""
    from refcheck.optimized.common import launch_only
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports bench_util beside it
    kda = importlib.import_module("kda")
    try:
        data = kda.profile_data("tiny")
        stages = {stage for stage, *_ in kda.PROFILE_VARIANTS}
        ran = set()
        for stage, cfg, safe, gather in kda.PROFILE_VARIANTS:
            if stage not in ran and launch_only(cfg) in (dict(), dict(segments="auto")):
                kda.profile_stage(data, stage, cfg, safe, gather)()
                ran.add(stage)
        assert ran == stages and {"front", "intra", "recurrence", "grads"} <= ran
    finally:
        sys.modules.pop("kda", None)  # no module of this process after the test
