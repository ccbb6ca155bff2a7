"""refcheck.runtime.autotune: on a GPU run every autotuned kernel runs one config per key, drawn from the
run's seed, the same in every process; a config the GPU refuses is skipped as the autotuner would.

The kernels here are stand-ins for a compiled ``@triton.jit`` function under a real
``triton.runtime.autotuner.Autotuner``: they record the config each launch got."""
from __future__ import annotations

import pytest

from refcheck.runtime import autotune
from refcheck.runtime.autotune import SEED_ENV


class StandIn:
    """What the Autotuner wraps: ``run`` records the BLOCK it was launched with, and raises
    Triton's OutOfResources for the BLOCKs in ``refuse`` (a config over the shared-memory limit)."""

    def __init__(self, refuse=()):
        def kernel(x, n):
            pass
        self.fn = kernel
        self.arg_names = ["x", "n"]
        self.refuse = set(refuse)
        self.launched: list[int] = []

    def run(self, *args, **kwargs):
        from triton.runtime.errors import OutOfResources
        if kwargs["BLOCK"] in self.refuse:
            raise OutOfResources(kwargs["BLOCK"] * 1024, 228 * 1024, "shared memory")
        self.launched.append(kwargs["BLOCK"])


def tuned(refuse=(), blocks=(16, 32, 64, 128)):
    import triton
    from triton.runtime.autotuner import Autotuner
    stand_in = StandIn(refuse)
    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in blocks]
    return Autotuner(stand_in, stand_in.arg_names, configs, ["n"], None, None), stand_in


@pytest.fixture
def drawn(monkeypatch):
    monkeypatch.delenv(autotune.MODE_ENV, raising=False)
    assert autotune.install()
    yield
    autotune.uninstall()


def test_one_config_per_kernel_the_same_for_every_key_and_process(drawn, monkeypatch):
    monkeypatch.setenv(SEED_ENV, "7")
    tuner, kernel = tuned()
    for n in (5, 6, 7, 5):                      # three keys: no benchmark, one launch each
        tuner.run(None, n)
    assert len(kernel.launched) == 4 and len(set(kernel.launched)) == 1
    again, kernel2 = tuned()                    # a new process: the same seed, the same config
    again.run(None, 9)
    assert kernel2.launched == kernel.launched[:1]
    assert list(autotune.chosen().values())[-1].startswith(f"BLOCK: {kernel.launched[0]}")


def test_seeds_draw_different_configs(drawn, monkeypatch):
    picks = set()
    for s in range(40):
        monkeypatch.setenv(SEED_ENV, str(s))
        tuner, kernel = tuned()
        tuner.run(None, 3)
        picks.add(kernel.launched[0])
    assert picks == {16, 32, 64, 128}


def test_a_refused_config_is_skipped_and_the_next_one_runs(drawn, monkeypatch):
    monkeypatch.setenv(SEED_ENV, "1")
    tuner, kernel = tuned()
    tuner.run(None, 3)
    first = kernel.launched[0]
    refusing, kernel2 = tuned(refuse={first})
    refusing.run(None, 3)
    refusing.run(None, 4)
    assert kernel2.launched and first not in kernel2.launched and len(set(kernel2.launched)) == 1


def test_a_kernel_refusing_every_config_raises(drawn):
    from triton.runtime.errors import OutOfResources
    tuner, _ = tuned(refuse={16, 32, 64, 128})
    with pytest.raises(OutOfResources):
        tuner.run(None, 3)


def test_benchmark_mode_leaves_triton_alone(monkeypatch):
    from triton.runtime.autotuner import Autotuner
    stock = Autotuner.prune_configs
    monkeypatch.setenv(autotune.MODE_ENV, "benchmark")
    assert not autotune.install()
    assert Autotuner.prune_configs is stock
    monkeypatch.setenv(autotune.MODE_ENV, "fastest")
    with pytest.raises(ValueError, match="REFCHECK_AUTOTUNE"):
        autotune.mode()


def test_reproducer_carries_the_seed_only_when_configs_are_drawn(drawn, monkeypatch):
    monkeypatch.setenv(SEED_ENV, "12")
    assert autotune.reproducer_env() == f"{SEED_ENV}=12 "
    monkeypatch.setenv(SEED_ENV, "0")
    assert autotune.reproducer_env() == ""
