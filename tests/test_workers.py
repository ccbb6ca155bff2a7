"""refcheck.runtime.workers: a run stopped by a time limit keeps the results of the units that finished."""
import pytest
from rich.console import Console

from refcheck.runtime.workers import Interrupted, Unit, execute


def _square(x, device):
    if x == 3:
        raise KeyboardInterrupt       # what the SIGINT of `timeout -s INT` raises in the main process
    return x * x


def test_a_stopped_run_keeps_what_finished():
    units = [Unit(f"u{x}", _square, (x,), 1.0, lambda r: [r]) for x in range(6)]
    with pytest.raises(Interrupted) as stopped:
        execute(units, "cpu", 1, Console(quiet=True), "test")
    assert stopped.value.results == [0, 1, 4]
    assert stopped.value.unfinished == ["u3", "u4", "u5"]


def test_the_first_wave_starts_one_unit_per_group_then_the_costliest():
    from refcheck.runtime.workers import Unit, order
    units = [Unit(f"u{i}", print, (), cost, list, group=group)
             for i, (cost, group) in enumerate([(5, "kda"), (9, "kda"), (1, "gla"), (7, "kda"), (2, "gla")])]
    assert order(units) == [1, 4, 3, 0, 2]


def _lose_context(x, device):
    import os
    if x == 2:
        os._exit(70)                  # what release_gpu does after a kernel's illegal memory access
    return x * x


def test_a_unit_that_ends_its_worker_is_a_crash_of_that_unit_and_the_run_goes_on():
    units = [Unit(f"u{x}", _lose_context, (x,), 1.0, lambda r: [r], crashed=lambda message: f"crashed: {message}")
             for x in range(5)]
    results = execute(units, "cpu", 2, Console(quiet=True), "test")
    assert results[:2] == [0, 1] and results[3:] == [9, 16]
    assert results[2].startswith("crashed: the worker process running it died (exit status 70: it lost the CUDA context")


def test_a_lost_cuda_context_ends_the_worker(monkeypatch):
    import torch

    from refcheck.runtime import workers

    def illegal_address():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def exit_now(code):
        raise SystemExit(code)
    monkeypatch.setattr(torch.cuda, "synchronize", illegal_address)
    monkeypatch.setattr(workers.os, "_exit", exit_now)
    with pytest.raises(SystemExit) as ended:
        workers.release_gpu()
    assert ended.value.code == workers.CONTEXT_LOST


def test_an_example_that_loses_the_cuda_context_is_written_down_and_ends_the_process(monkeypatch, tmp_path):
    """What a law does on a GPU when a kernel makes an illegal memory access: the example that did it is
    the finding (its failure, with its reproducer, goes to ``REFCHECK_FAILURE_DIR``), and the process
    ends so that xdist or the pool replaces it, instead of failing every later example of the worker."""
    from refcheck.engine.examples import Example
    from refcheck.engine.laws import LawViolation, check
    from refcheck.model.case import Case
    from refcheck.runtime import workers
    from tests.mutants import MUTANTS

    def exit_now(code):
        raise SystemExit(code)
    monkeypatch.setattr(workers, "context_lost", lambda device: True)
    monkeypatch.setattr(workers.os, "_exit", exit_now)
    monkeypatch.setenv(workers.FAILURE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    case = Case.make("attention", dict(B=1, T=8, S=8, H=1, Hk=1, Dqk=4, Dv=4), "fp32", 0, options={"causal": True})
    impl = MUTANTS["attention_off_by_one_causal"].impl
    with pytest.raises(SystemExit) as ended:
        check("agreement", impl, Example(case, impl.modes[0], {}, {}))
    assert ended.value.code == workers.CONTEXT_LOST
    [written] = tmp_path.iterdir()
    text = written.read_text()
    assert "the CUDA context was lost" in text and "reproduce: python -c" in text and "attention_off_by_one_causal" in text
    # outside a worker (a reproducer, a user's own session) the process lives on: the loss is raised
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    with pytest.raises(LawViolation, match="(?s)the CUDA context was lost.*can no longer use the GPU"):
        check("agreement", impl, Example(case, impl.modes[0], {}, {}))


def test_workers_go_round_the_gpus_of_a_host(monkeypatch):
    """Issue 18: on a host with several GPUs, worker i (a pool's slot, an xdist worker's number) runs on
    GPU i mod GPUs, made the process's current device before it allocates."""
    import torch

    from refcheck.commands.pytest_plugin import xdist_worker_index
    from refcheck.runtime import workers

    assert [workers.gpu_of(i, 2) for i in range(5)] == [0, 1, 0, 1, 0]
    assert [workers.gpu_of(i, 1) for i in range(3)] == [0, 0, 0]
    assert [xdist_worker_index(w) for w in ("gw0", "gw7", "gw12", "master")] == [0, 7, 12, 0]
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert [workers.pin_gpu(i) for i in (0, 5, 10)] == [0, 1, 2] and chosen == [0, 1, 2]
    assert workers.default_jobs("cuda") == min(workers.MAX_GPU_JOBS * 4, workers.cores())


def test_a_shared_example_database_serves_every_profile_that_keeps_examples(monkeypatch, tmp_path):
    """Issue 18: ``REFCHECK_EXAMPLE_DB`` names one directory of failing examples for every process, host
    and CI run; ``ci`` keeps none (derandomized, reproducible)."""
    from hypothesis import settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    from refcheck.strategies import profiles

    monkeypatch.setenv(profiles.EXAMPLE_DB_ENV, str(tmp_path))
    try:
        profiles.register()
        for name in ("dev", "fuzz", "gpu"):
            db = settings.get_profile(name).database
            assert isinstance(db, DirectoryBasedExampleDatabase) and str(db.path) == str(tmp_path), name
        assert settings.get_profile("ci").database is None
    finally:
        monkeypatch.delenv(profiles.EXAMPLE_DB_ENV)
        profiles.register()
    assert str(getattr(settings.get_profile("dev").database, "path", "")) != str(tmp_path)


def test_a_lost_context_names_the_kernel_whose_launch_raised(monkeypatch):
    """Which Triton kernel a CUDA fault surfaced at, read from the launching frame (also through an
    exception raised from it); it is the kernel at fault only with synchronous launches."""
    import torch
    import triton
    import triton.language as tl

    from refcheck.runtime import interpreter, workers

    interpreter.interpret_new_kernels()

    @triton.jit
    def raises_at_launch(x_ptr, n):
        tl.static_assert(n < 0, "a launch that raises")

    with pytest.raises(Exception) as launched:
        raises_at_launch[(1,)](torch.zeros(4), 3)
    try:
        raise RuntimeError("the law's own error") from launched.value
    except RuntimeError as err:
        wrapped = err
    name = f"{__name__}.raises_at_launch"
    assert workers.failed_launch(wrapped) == name
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    assert f"surfaced at the launch of {name}" in workers.crash_site(wrapped)
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    assert workers.crash_site(wrapped) == f" in {name}"
    assert workers.failed_launch(RuntimeError("no launch")) is None


def test_n_auto_on_a_gpu_takes_refcheck_count_before_xdist(monkeypatch):
    """``-n auto --device cuda`` gives refcheck's worker count (at most ``MAX_GPU_JOBS`` a GPU), not
    xdist's core count: refcheck's hook answers first although xdist registers its own after a plugin
    given with ``-p`` (an H100 law run got 16 workers and ran out of GPU memory)."""
    import pluggy
    import torch
    import xdist.newhooks
    import xdist.plugin

    from refcheck.commands import pytest_plugin
    from refcheck.runtime import workers

    manager = pluggy.PluginManager("pytest")
    manager.add_hookspecs(xdist.newhooks)
    manager.register(pytest_plugin)     # as ``-p refcheck.commands.pytest_plugin`` does, first
    manager.register(xdist.plugin)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(workers, "cores", lambda: 4 * workers.MAX_GPU_JOBS)

    class Config:
        option = type("Option", (), {"numprocesses": "auto"})()

        @staticmethod
        def getoption(name, default=None):
            return "cuda" if name == "--device" else default
    assert manager.hook.pytest_xdist_auto_num_workers(config=Config()) == workers.MAX_GPU_JOBS
