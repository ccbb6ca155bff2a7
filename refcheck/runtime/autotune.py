"""Autotuned kernels on a GPU verification run: one config per kernel, drawn from the run's seed.

Triton's ``@triton.autotune`` compiles and benchmarks every config of a kernel on every new key
(its ``key`` arguments and the dtype of every tensor argument) and keeps the fastest. A verification
run pays that for nothing it checks: measured on an H100 with a cold cache, flash-linear-attention's
``chunk_kda`` forward+backward compiles about 150 configs (some 15 kernels) per key, 195-250 s, and
a law run needs several keys per entry point (``benchmarks/results/compile_time_h200.json``,
``gpu_time_to_verdict_h100.json``). Worse for a verdict, the winner depends on timing noise, so two
processes (the run that failed and its reproducer) may run different configs.

So on a GPU (``refcheck.runtime.backend.configure_backend``), unless ``REFCHECK_AUTOTUNE=benchmark``, every
autotuned kernel runs one config per key: ``Autotuner.prune_configs`` keeps one of the configs the
kernel's own pruning leaves, the same for every key of that kernel, picked by the run's seed
(``REFCHECK_BUCKET_SEED``, 0 when unset) and the kernel's name, so every process of a run, and the
reproducer given the same seed, runs the same config; another seed draws others, so campaigns cover
them. Triton then caches it without benchmarking. A config the GPU refuses (shared memory or
registers over the limit, a compile-time assertion: what the autotuner scores as infinitely slow)
is dropped for that kernel and the next one tried, as the autotuner would skip it.

``chosen()`` says which config each kernel ran in this process, for a failure's report.
"""
from __future__ import annotations

import os
import weakref
import zlib

SEED_ENV = "REFCHECK_BUCKET_SEED"
"""The run's seed of compile buckets and autotune configs (``refcheck.engine.buckets`` sets it): every process
of a run derives the same choices from it."""

MODE_ENV = "REFCHECK_AUTOTUNE"
"""``drawn`` (the default on a GPU): one config per kernel drawn from the seed; ``benchmark``:
Triton's own autotuning (every config compiled and timed, the fastest kept)."""
MODES = ("drawn", "benchmark")

_STOCK: dict[str, object] = {}
_REFUSED: weakref.WeakKeyDictionary[object, list] = weakref.WeakKeyDictionary()
_CHOSEN: dict[str, str] = {}


def mode() -> str:
    """The autotune mode of this process (``MODE_ENV``), checked."""
    value = os.environ.get(MODE_ENV, "drawn")
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}: expected one of {MODES}, got {value!r}")
    return value


def install() -> bool:
    """Draw autotune configs in this process unless ``mode()`` is ``benchmark``. Idempotent;
    returns whether drawing is in effect."""
    if mode() == "benchmark":
        return False
    if _STOCK:
        return True
    from triton.runtime.autotuner import Autotuner
    _STOCK["prune_configs"] = Autotuner.prune_configs
    _STOCK["run"] = Autotuner.run
    Autotuner.prune_configs = _prune_configs
    Autotuner.run = _run
    return True


def uninstall() -> None:
    """Restore Triton's autotuning. Idempotent."""
    if not _STOCK:
        return
    from triton.runtime.autotuner import Autotuner
    Autotuner.prune_configs = _STOCK.pop("prune_configs")
    Autotuner.run = _STOCK.pop("run")


def seed() -> int:
    """The seed configs are drawn from: the run's bucket seed, 0 when none is set."""
    return int(os.environ.get(SEED_ENV) or 0)


def reproducer_env() -> str:
    """What a reproducer's command line sets to run the configs this process ran: the seed, when
    configs are drawn here from a seed other than 0 ('' otherwise)."""
    return f"{SEED_ENV}={seed()} " if _STOCK and seed() else ""


def describe() -> str:
    """One line for a run's header: how autotuned kernels run in this process."""
    if not _STOCK:
        return "autotuned kernels: Triton's autotuning (every config compiled and timed)"
    return (f"autotuned kernels: one config each, drawn from seed {seed()} "
            f"({MODE_ENV}=benchmark for Triton's autotuning)")


def chosen() -> dict[str, str]:
    """The config each autotuned kernel ran in this process, by kernel name."""
    return dict(_CHOSEN)


def _name(tuner) -> str:
    fn = tuner.base_fn
    return f"{fn.__module__}.{fn.__qualname__}"


def _prune_configs(self, kwargs):
    configs = _STOCK["prune_configs"](self, kwargs)
    refused = _REFUSED.get(self, ())
    usable = [c for c in configs if c not in refused]
    if not usable:          # every config left for this key refused: let Triton's autotuner have them
        return configs
    name = _name(self)
    pick = usable[zlib.crc32(f"{seed()}/{name}".encode()) % len(usable)]
    _CHOSEN[name] = str(pick)
    return [pick]


def _refusals() -> tuple[type, ...]:
    """What the autotuner scores as an infinitely slow config rather than an error."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime import errors
    return tuple(e for e in (errors.OutOfResources, getattr(errors, "PTXASError", None),
                             CompileTimeAssertionFailure) if e is not None)


def _run(self, *args, **kwargs):
    refusals = _refusals()
    while True:
        try:
            return _STOCK["run"](self, *args, **kwargs)
        except refusals:
            config = getattr(self, "best_config", None)
            refused = _REFUSED.setdefault(self, [])
            if config is None or config in refused or len(self.configs) <= 1:
                raise
            refused.append(config)
            for key in [k for k, c in self.cache.items() if c == config]:
                del self.cache[key]
            if len(refused) >= len(self.configs):
                raise
