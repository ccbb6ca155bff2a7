"""Helpers the GPU benchmarks share (``kda.py``, ``gla.py``, ``attention.py``, ``paged_attention.py``, ``gdn.py``):
errors against float64, the roofline measured in the same run, medians of CUDA timings, memory-bound entries."""
from __future__ import annotations

import contextlib
import os
from unittest import mock

import torch


def faithful_on_cpu(device: str) -> None:
    """On the CPU under ``TRITON_INTERPRET=1`` (a dry run) the faithful interpreter (``refcheck.runtime.interpreter``),
    as refcheck's own CPU runs take: the stock one multiplies a bf16 dot's bit patterns as integers, and what its
    garbage values then take (KDA's exact diagonal walks, for sub-chunks flagged on garbage decays) no GPU run takes.
    Without it (``kernel_resources.py`` importing a script to compile its launches offline) nothing changes."""
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        from refcheck.runtime.backend import configure_backend
        configure_backend("cpu")


def rel(x, ref) -> float:
    """``||x - ref|| / ||ref||`` in float64."""
    ref = ref.detach().double()
    return float((x.detach().double() - ref).norm() / ref.norm().clamp_min(1e-300))


def roofline():
    """This GPU's bf16 matmul rate (TFLOP/s, 8192^3) and device copy rate (GB/s, read + write of 1 GiB)."""
    from triton.testing import do_bench
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, return_mode="median")
    src = torch.empty(2 ** 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms_copy = do_bench(lambda: dst.copy_(src), return_mode="median")
    return dict(bf16_tflops=2 * n ** 3 / ms / 1e9, copy_gbps=2 * src.numel() / ms_copy / 1e6)


def copy_rate_entry(fn, time_ms, size: int, roof: dict, error) -> dict:
    """One implementation's entry of a memory-bound row: ``{"ms", "gbps", "of_copy", "rel_err"}`` with ``time_ms()``
    its median time, ``size`` the bytes the step must move, ``roof`` the run's ``roofline()`` and ``error()`` its
    errors against float64; ``{"error": ...}`` where ``fn`` is why it is unavailable (a string) or it raised."""
    if not callable(fn):
        return {"error": fn}
    try:
        ms = time_ms()
        gbps = size / ms / 1e6
        return {"ms": ms, "gbps": gbps, "of_copy": gbps / roof["copy_gbps"], "rel_err": error()}
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:300]}


def save_rows(out: str | None, roof: dict, rows: list) -> None:
    """Print the last row and, where ``out`` is given, write every row so far with the run's roofline, device, torch
    version and date: after every row, so that a run cut short keeps what it measured."""
    import json
    import time
    from pathlib import Path
    print(json.dumps(rows[-1]), flush=True)
    if out:
        Path(out).write_text(json.dumps(dict(roofline=roof, rows=rows, device=torch.cuda.get_device_name(),
                                             torch=torch.__version__, when=time.strftime("%Y-%m-%d")), indent=1))


@contextlib.contextmanager
def autotune_share(slot: int, slots: int):
    """Within this context every autotuned Triton kernel (``triton.autotune``, FLA's too) tries only its
    configs number ``slot, slot + slots, ...``: ``slots`` warm-up processes together compile every config
    into Triton's on-disk cache, each a share, and the timing process's own autotuning then finds them
    compiled (its choice stays its own: the autotuning results on disk are keyed by the configs tried).
    A config the GPU refuses (a single config is launched, not benchmarked) is skipped."""
    from triton.runtime.autotuner import Autotuner
    run = Autotuner.run

    def share(self, *args, **kwargs):
        full = self.configs
        self.configs = full[slot::slots] or [full[slot % len(full)]]
        try:
            return run(self, *args, **kwargs)
        except Exception:  # a warm-up: the outputs are not read
            return None
        finally:
            self.configs = full
    with mock.patch.object(Autotuner, "run", share):
        yield


def warm(script: str, jobs_args: list[list[str]], jobs: int, flag: str = "--warm-one"):
    """Run ``python script FLAG *args`` for every entry of ``jobs_args``, ``jobs`` at a time: each
    compiles (into Triton's on-disk cache, and FLA's autotuning results with ``TRITON_CACHE_AUTOTUNING=1``)
    what timing its configuration runs. A compile takes 5 to 30 s and a process compiles one kernel at a
    time, so the timing process then finds every kernel compiled."""
    import subprocess
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    def run(args):
        p = subprocess.run([sys.executable, script, flag, *args], capture_output=True, text=True)
        return args, p.returncode, p.stderr[-400:]
    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        for args, rc, err in pool.map(run, jobs_args):
            if rc:
                print(f"warm-up {args} failed:\n{err}", flush=True)
    print(f"warm-up: {len(jobs_args)} configurations compiled in {time.perf_counter() - t:.0f} s", flush=True)


def kernel_times(steps: dict, top: int = 12, repeats: int = 3) -> dict[str, dict[str, float]]:
    """CUDA time per kernel of each named step (a no-argument callable; torch.profiler, mean of
    ``repeats`` after one untimed call): ``{step: {kernel: ms}}``, the ``top`` longest kernels and, under
    "(every kernel)", the sum over all of them."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for name, step in steps.items():
        try:
            step()
        except Exception as err:  # a peer that refuses (FLA's gated backward on Hopper with Triton < 3.7.1)
            print(f"kernels {name}: {type(err).__name__}: {str(err)[:160]}", flush=True)
            continue
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                step()
            torch.cuda.synchronize()
        times = sorted(((e.key, e.device_time_total / repeats / 1e3) for e in prof.key_averages()), key=lambda r: -r[1])
        out[name] = {key[:60]: round(ms, 3) for key, ms in times[:top]}
        out[name]["(every kernel)"] = round(sum(ms for _, ms in times), 3)
        print(f"kernels {name}: " + ", ".join(f"{k[:28]} {v:.3f}" for k, v in list(out[name].items())[:8]), flush=True)
    return out
