"""Hypothesis profiles of refcheck, registered in one place: pytest (``--hypothesis-profile``, default
``ci``) and ``refcheck fuzz`` load them by name.

* ``ci``: bounded and reproducible: 10 examples per law (divided by the law's cost, at least 3),
  derandomized (the same examples every run), no example database, no deadline (interpreted Triton
  kernels take seconds per example). The default, in CI and elsewhere.
* ``dev``: 30 examples, random, failures saved in the example database and replayed first
  (``.hypothesis/examples``, or the shared directory of ``EXAMPLE_DB_ENV``).
* ``fuzz``: 500 examples, random, database: hunting for bugs in a new kernel.
* ``gpu``: 12 examples on the GPU with ``LARGE`` sizes (several chunks per sequence), random. Few
  because a GPU example is compile-bound, not run-bound: each drawn configuration (dtype, padded head
  dims, precision, knobs) compiles its own Triton specializations, 5 to 30 s per kernel on an H200,
  where the run itself takes milliseconds; with 60 examples 7 of the 27 kda/kda_gate law tests
  finished in 295 s on 16 cores. The breadth comes from the CPU interpreter (``ci``/``dev``/``fuzz``);
  the GPU run proves the compiled code paths (real tensor cores, fast math) at sizes of many chunks.

A ``gpu`` run is ``BUCKETED``: what a compiler specializes on is drawn from a few compile buckets
per implementation, compiled in parallel before the first example (``refcheck.engine.buckets``), and
every law gets the profile's full example count (once compiled, an example costs milliseconds).

``limits(profile, interpreted)`` gives the case sizes that go with each profile. A law's example
count is the profile's ``max_examples`` divided by the law's cost (implementation runs per example),
and for a Triton kernel in the CPU interpreter (seconds per call) multiplied by
``refcheck.engine.laws.INTERPRETED_SHARE``: at least 2 either way (``refcheck.engine.laws.examples_for``).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from . import INTERPRETED, LARGE, SMALL, Limits

DEFAULT = "ci"

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PROFILES: dict[str, dict] = {
    "ci": dict(max_examples=10, derandomize=True, database=None, **_COMMON),
    "dev": dict(max_examples=30, **_COMMON),
    "fuzz": dict(max_examples=500, **_COMMON),
    "gpu": dict(max_examples=12, **_COMMON),
}

SIZES: dict[str, Limits] = {"ci": SMALL, "dev": SMALL, "fuzz": SMALL, "gpu": LARGE}

BUCKETED = ("gpu",)
"""Profiles whose runs draw compile buckets (``refcheck.engine.buckets``), each law its full example count."""


EXAMPLE_DB_ENV = "REFCHECK_EXAMPLE_DB"
"""A directory of failing examples for every profile that keeps them (all but ``ci``), shared by every
process, host and CI run that names it (shared storage; in CI one restored before the run and saved
after it): a counterexample found anywhere is replayed first everywhere. Unset: Hypothesis' own
``.hypothesis/examples`` in the working directory, which the xdist workers of one host share."""


def shared_database():
    """The ``EXAMPLE_DB_ENV`` database, or None when the variable is unset."""
    from hypothesis.database import DirectoryBasedExampleDatabase
    path = os.environ.get(EXAMPLE_DB_ENV)
    return DirectoryBasedExampleDatabase(path) if path else None


def register() -> None:
    """Register every profile with Hypothesis (again after ``EXAMPLE_DB_ENV`` changed)."""
    shared = shared_database()
    for name, options in PROFILES.items():
        keeps = options.get("database", "default") is not None
        settings.register_profile(name, **options, **({"database": shared} if shared and keeps else {}))


def load(name: str = DEFAULT) -> settings:
    """Make ``name`` the active profile; returns its settings."""
    if name not in PROFILES:
        raise ValueError(f"profile: expected one of {', '.join(PROFILES)}, got {name!r}")
    register()
    settings.load_profile(name)
    return settings.get_profile(name)


def limits(name: str, interpreted: bool = False) -> Limits:
    """The case sizes of a profile: ``LARGE`` for ``gpu``, else ``SMALL``, or ``INTERPRETED`` for a
    Triton kernel run by the CPU interpreter; unknown names get ``SMALL``."""
    if interpreted and name != "gpu":
        return INTERPRETED
    return SIZES.get(name, SMALL)
