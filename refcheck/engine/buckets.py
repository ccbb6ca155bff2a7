"""Compile buckets: few compiler specializations per run, compiled in parallel before the first example.

On a GPU an example is compile-bound, not run-bound: a Triton kernel compiles once per
specialization (dtypes, head dims, constexpr flags) and an autotuner benchmarks every config of
every kernel once per key, where Triton's autotuner keys on its ``key`` arguments *and the dtype
of every tensor argument*, so an absent initial state or a packed batch is a new key. Measured on
an H200 (``benchmarks/results/compile_time_h200.json``): flash-linear-attention's ``chunk_kda``
forward+backward took 247 s on a new key, 0.64 s on a known one in a new process. Drawing every
example's specialization freely pays minutes per example.

So a GPU run (the ``gpu`` profile) draws what a compiler specializes on, the case ``signature``
(``refcheck.strategies``), the precision mode and the knobs, from a few ``Bucket``s per
implementation, chosen at the start of the run from its seed; lengths, batch, packing boundaries
and values stay free. ``plan`` picks them: one drawn freely, then, for every law none of them
admits (a law that needs packed sequences, fp16 gates, fp32 inputs, ...), the first changed in
what that law needs and nothing else. ``warm_up`` compiles them
all in parallel processes before the first example: each law once on a small example of each
bucket it admits (a law's own calls, such as the separate runs of ``varlen_equals_separate``,
compile what they need). Triton's compile cache and its on-disk autotuning results
(``TRITON_CACHE_AUTOTUNING=1``) carry what one process compiled to every other and to the next
run, so the warm-up goes in two phases: first ``agreement`` once on every bucket, all at once (the
buckets of an implementation differ in what its autotuners key on, so they share little); then
every other law on every bucket it admits, which finds almost everything compiled.

Measured on an H100 with a cold cache, the six flash-linear-attention entry points: the first
bucket of each, alone, took 260 s (chunk_kda the longest); 14 agreement runs of the chunk ops at
once, head dims up to 256, had finished 10 after 474 s (``benchmarks/results``).

The run's seed (``SEED_ENV``) is printed with the run and makes it reproducible: every pytest-xdist
worker and every warm-up process derives the same buckets from it.
"""
from __future__ import annotations

import dataclasses
import os
import random
import time
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runtime.autotune import SEED_ENV

if TYPE_CHECKING:
    from ..model.implementation import Implementation
    from .examples import Example

WARM_LENGTHS = (1, 64, 65)
"""Lengths of the warm-up examples: one token, at and one past a chunk for ``agreement``, one past
for the other laws: Triton specializes an int argument equal to 1 or divisible by 16, so these
three meet every specialization of a length (and of a chunk count, 1 or 2)."""


def run_seed(given: int | None = None) -> int:
    """The run's bucket seed: ``given``, else the one in ``SEED_ENV``, else a fresh random one;
    stored in ``SEED_ENV`` so that processes started later derive the same buckets."""
    if given is None:
        given = int(os.environ[SEED_ENV]) if os.environ.get(SEED_ENV) else random.SystemRandom().randrange(2**32)
    os.environ[SEED_ENV] = str(given)
    return given


def _draw(strategy, seed: int, *, simplest: bool = False):
    """A value of a Hypothesis strategy, the same for the same seed: its simplest value (the first
    Hypothesis generates), else one picked by ``seed`` among the first ``DRAWS`` it generates."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    found: list = []

    @settings(max_examples=1 if simplest else DRAWS, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @hseed(seed)
    @given(strategy)
    def collect(value):
        found.append(value)

    collect()
    return found[0] if simplest else random.Random(seed).choice(found)


DRAWS = 20
"""How many values ``_draw`` picks a bucket from."""


def _seed(seed: int, *parts: str) -> int:
    return zlib.crc32("/".join((str(seed), *parts)).encode())


def plan(impl, limits, *, seed: int, mode: str | None = None) -> tuple:
    """The buckets of ``impl`` for a run: one drawn freely, then one for every law that applies to
    ``impl`` and that no bucket so far admits, drawn with the law's requirements and everything
    else of the first bucket (its mode, knobs and every signature field the law does not ask to
    differ): a second bucket that is the first packed differs in nothing else, so that a law's
    own calls (the packed sequences run alone, a state carried) meet what is already compiled.
    Depends only on ``impl``, ``limits``, ``mode`` and ``seed``, not on which law tests run."""
    from hypothesis import strategies as st

    from ..strategies import knob_settings, modes
    from .examples import Bucket, cases, signature
    from .laws import LAWS

    strategy = st.tuples(cases(impl.op, impl, limits), modes(impl, mode), knob_settings(impl))
    case, first_mode, knobs = _draw(strategy, _seed(seed, impl.op, impl.name))
    first = Bucket(signature(case), first_mode, tuple(sorted(knobs.items())))
    buckets = [first]
    for law in LAWS.values():
        if law.why_not(impl) is not None or any(b.admits(law.requires) for b in buckets):
            continue
        wanted = Bucket.wanted(law.requires)
        pinned = {k: v for k, v in first.pinned if wanted.get(k, v) == v}
        case = _draw(cases(impl.op, impl, limits, pinned=pinned, **law.requires), _seed(seed, impl.op, impl.name, law.name))
        bucket = Bucket(signature(case), first.mode, first.knobs)
        if not bucket.admits(law.requires):
            raise AssertionError(f"{impl.op}/{impl.name}: the bucket drawn for law {law.name} does not admit it")
        buckets.append(bucket)
    return tuple(buckets)


# --- warming up ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WarmUp:
    """One warm-up run: ``law`` once on ``example`` (small, in one bucket) of ``impl``; ``phase`` 0
    compiles a bucket from nothing, phase 1 what a law adds to it."""

    law: str
    impl: Implementation
    example: Example
    phase: int

    @property
    def name(self) -> str:
        return f"warm-up {self.law} {self.impl.op}/{self.impl.name}"


def warm_ups(impl, buckets: tuple, *, seed: int) -> list[WarmUp]:
    """The warm-up runs of ``impl``: ``agreement`` on every bucket at ``WARM_LENGTHS[-1]`` (phase
    0: every kernel compiles and autotunes); then (phase 1) ``agreement`` at the other lengths and
    every other law that applies once on each bucket it admits (what a law's own calls add: an
    initial state, the sequences of a packed batch run alone)."""
    from ..strategies import SMALL
    from .examples import examples
    from .laws import LAWS

    found = []
    for law in LAWS.values():
        if law.why_not(impl) is not None:
            continue
        for i, bucket in enumerate(buckets):
            if not bucket.admits(law.requires):
                continue
            for length in WARM_LENGTHS if law.name == "agreement" else WARM_LENGTHS[-1:]:
                min_len = max(law.requires.get("min_len", 1), length)
                small = dataclasses.replace(law, requires={**law.requires, "min_len": min_len})
                limits = dataclasses.replace(SMALL, max_len=max(SMALL.max_len, min_len))
                example = _draw(examples(small, impl, limits, buckets=(bucket,)),
                                _seed(seed, impl.op, impl.name, law.name, str(i), str(length)), simplest=True)
                first = law.name == "agreement" and length == WARM_LENGTHS[-1]
                found.append(WarmUp(law.name, impl, example, 0 if first else 1))
    return found


def run_warm_up(job: WarmUp, device: str) -> tuple[str, float]:
    """Run one warm-up (in a worker process): ``("ok" | what it raised, seconds)``. A warm-up is a
    law's check on a drawn example like any other: what it raises is a finding (``warm_up``'s
    ``failed``), which a run that never meets the example again must still report."""
    from .laws import LawViolation, check

    started = time.perf_counter()
    try:
        check(job.law, job.impl, job.example, device=device, strict=False)
        status = "ok"
    except LawViolation as err:
        status = str(err)
    except Exception as err:
        status = f"{type(err).__name__}: {err}"
    return status, time.perf_counter() - started


def warm_up(jobs: list[WarmUp], device: str, processes: int, console) -> dict:
    """Run the warm-ups in ``processes`` worker processes (``refcheck.runtime.workers``: a process a kernel
    kills is replaced), phase by phase; returns what it took: ``{"runs", "seconds", "phases"
    (seconds each), "raised", "failed", "processes", "compiled"}`` (``failed``: ``(law, op,
    implementation name)`` -> what the first of its warm-ups that failed raised, or how its process
    died; ``compiled``: new entries in Triton's cache, one per kernel specialization or autotuning
    result)."""
    from ..runtime.workers import Unit, execute

    started, entries = time.perf_counter(), triton_cache_entries()
    outcomes: list[tuple[WarmUp, str]] = []
    phases = []
    for phase in sorted({j.phase for j in jobs}):
        began = time.perf_counter()
        mine = [j for j in jobs if j.phase == phase]
        units = [Unit(j.name, run_warm_up, (j,), 1.0, lambda result: [result],
                      crashed=lambda message: (f"crashed: {message}", 0.0)) for j in mine]
        results = execute(units, device, min(processes, len(units)), console, f"compiling buckets ({phase + 1}/2)")
        outcomes += [(j, status) for j, (status, _) in zip(mine, results)]
        phases.append(round(time.perf_counter() - began, 1))
    failed: dict[tuple[str, str, str], str] = {}
    for job, status in outcomes:
        if status != "ok":
            failed.setdefault((job.law, job.impl.op, job.impl.name), status)
    return {"runs": len(outcomes), "seconds": round(time.perf_counter() - started, 1), "phases": phases,
            "raised": sum(1 for _, status in outcomes if status != "ok"), "failed": failed, "processes": processes,
            "compiled": triton_cache_entries() - entries}


def triton_cache_dir() -> str:
    """Triton's on-disk cache of compiled kernels (and, with ``TRITON_CACHE_AUTOTUNING=1``, of
    autotuning results)."""
    try:
        import triton
        return triton.knobs.cache.dir
    except (ImportError, AttributeError):  # triton before 3.4 has no knobs
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def triton_cache_entries() -> int:
    """How many entries Triton's cache holds: one more for every kernel specialization compiled
    (in any process), so a count that grows across an example says the example compiled."""
    try:
        with os.scandir(triton_cache_dir()) as entries:
            return sum(1 for _ in entries)
    except OSError:
        return 0
