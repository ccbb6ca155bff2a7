"""How long Triton has compiled in this process: where a GPU run's time goes.

A law run on a GPU is compile-bound until every specialization it meets is compiled (the head
dims and dtypes of a bucket, but also an int argument equal to 1 or divisible by 16, a new autotune
key); the warm-up (``refcheck.engine.buckets``) is meant to pay that before the first example, and this
clock says what it left: Triton's own compilation listener (``triton.knobs.compilation.listener``)
reports every compile with its duration, and the clock adds them up. ``install`` chains any
listener already set; on a Triton without the listener the clock reads nothing (``available``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Reading:
    """Compiles this process has seen since ``install``: how many missed Triton's cache and the
    seconds they took (``CompileTimes.total``), and how many were found in the cache."""

    compiles: int = 0
    seconds: float = 0.0
    cache_hits: int = 0

    def __sub__(self, other: Reading) -> Reading:
        return Reading(self.compiles - other.compiles, self.seconds - other.seconds, self.cache_hits - other.cache_hits)


_TOTAL = Reading()
_STATE: dict[str, object] = {}


def available() -> bool:
    """Whether this Triton reports compiles to a listener."""
    try:
        from triton import knobs
    except ImportError:
        return False
    return hasattr(getattr(knobs, "compilation", None), "listener")


def install() -> bool:
    """Start the clock in this process (idempotent); False where Triton has no listener."""
    if "installed" in _STATE:
        return True
    if not available():
        return False
    from triton import knobs
    previous = knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit, **extra):
        if cache_hit:
            _TOTAL.cache_hits += 1
        else:
            _TOTAL.compiles += 1
            _TOTAL.seconds += times.total / 1e6
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit,
                     **extra)

    knobs.compilation.listener = listener
    _STATE["installed"] = True
    return True


def reading() -> Reading:
    """What the clock has counted so far in this process (a copy)."""
    return Reading(_TOTAL.compiles, _TOTAL.seconds, _TOTAL.cache_hits)
