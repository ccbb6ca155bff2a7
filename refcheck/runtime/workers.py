"""Running the grid's work in worker processes, shared by ``refcheck report`` and ``drift record``.

Interpreted Triton kernels are single-threaded Python, so on the CPU the work is spread over
spawned processes (each configures the backend before any kernel module is imported). On a GPU the
work always runs in worker processes, so that a kernel that kills its process (an illegal memory
access, a device-side assert, a segfault) is a finding about its unit, reported with its
reproducer, and the run goes on with a fresh process; as many processes as cores (up to 16), since
a cold GPU run is bound by compiling kernels, one core per compiler. Work comes as ``Unit``s;
results come back in the order of the units, whatever order the processes finish in, so a run does
not depend on ``jobs``.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

MAX_JOBS = 4
MAX_GPU_JOBS = 8
GPU_MEMORY_SHARE = 0.9
"""The share of the GPU's memory the worker processes together may hold (PyTorch's allocator):
each gets ``GPU_MEMORY_SHARE / jobs`` and gives back what it cached after every unit. On an H100,
16 workers without a share exhausted its 80 GB: units of pure PyTorch code crashed with out of
memory (``benchmarks/results/gpu_time_to_verdict_h100.json``)."""


@dataclass
class Unit:
    """A unit of work: ``fn(*args, device)`` runs in a worker and returns plain (picklable) data,
    ``wrap`` turns that into results; ``cost`` orders the units (largest first, so that the pool is
    not left waiting on one long unit at the end); units of one ``group`` (an implementation)
    compile the same kernels (``order``)."""

    name: str
    fn: Callable
    args: tuple
    cost: float
    wrap: Callable[[Any], Iterable]
    crashed: Callable[[str], object] | None = None   # the result to record when its process died
    group: str = ""

    def died(self, message: str):
        """What the unit's result is when the process running it died (a segfault, an abort, a
        device-side assert): its ``crashed`` result, else the run cannot go on."""
        if self.crashed is None:
            raise RuntimeError(f"{self.name}: {message}")
        return self.crashed(message)


def default_jobs(device: str) -> int:
    """Worker processes: the usable cores, at most ``MAX_JOBS`` on the CPU (interpreted kernels),
    at most ``MAX_GPU_JOBS`` on a GPU (where a cold run is bound by compiling, one core each, and
    the processes share the GPU's memory)."""
    return max(1, min(MAX_JOBS if device == "cpu" else MAX_GPU_JOBS, cores()))


def cores() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_process(device: str, jobs: int) -> int:
    """Intra-op threads for each of ``jobs`` worker processes: one on the CPU (interpreted kernels
    and tiny tensors: more threads only synchronise), on a GPU run a share of the cores, which
    compute the float64 references (``refcheck.engine.verify.REFERENCE_DEVICE``)."""
    return 1 if device == "cpu" else max(1, cores() // max(1, jobs))


def _init_worker(device: str, jobs: int = 1) -> None:
    """A worker process: the backend before any kernel is imported, its intra-op threads, on a GPU
    its share of the memory (one of ``jobs``)."""
    import torch

    from .backend import configure_backend
    configure_backend(device)
    torch.set_num_threads(threads_per_process(device, jobs))
    if torch.device(device).type == "cuda" and jobs > 1:
        torch.cuda.set_per_process_memory_fraction(GPU_MEMORY_SHARE / jobs)


CONTEXT_LOST = 70
"""Exit status of a worker whose CUDA context a unit left unusable."""


def _run_unit(fn, args: tuple, device: str):
    """One unit in a worker; on a GPU the memory it cached goes back for the other workers."""
    try:
        return fn(*args, device)
    finally:
        if device != "cpu":
            release_gpu()


def release_gpu() -> None:
    """After a unit on a GPU: wait for its kernels and give back the memory it cached. A kernel that
    made an illegal memory access or failed a device-side assert leaves the process's CUDA context
    unusable (every later CUDA call raises, this one first): the worker ends at once, the pool
    breaks, and the unit runs again in a process of its own (``_alone``), where its crash is
    reported as its finding, with its input; the run goes on. Seen on an H100: an illegal address
    in a warm-up unit, raised from ``empty_cache`` here, ended a whole pytest session."""
    import torch
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:       # torch.AcceleratorError (a RuntimeError): the context is lost
        os._exit(CONTEXT_LOST)


def order(units: list[Unit]) -> list[int]:
    """The order units start in: the costliest unit of each group first, then every other unit,
    costliest first. On a GPU with a cold cache the first units of an implementation compile its
    kernels; started together, N of them would compile the same kernels N times at once, where one
    compiles them and the rest find them in Triton's cache."""
    by_cost = sorted(range(len(units)), key=lambda i: -units[i].cost)
    leaders: dict[str, int] = {}
    for i in by_cost:
        leaders.setdefault(units[i].group or units[i].name, i)
    first = set(leaders.values())
    return [i for i in by_cost if i in first] + [i for i in by_cost if i not in first]


class Interrupted(KeyboardInterrupt):
    """The run was stopped (Ctrl-C, or the SIGINT of a time limit) before every unit finished:
    ``results`` of those that did (in the order of the units), ``unfinished`` the others' names."""

    def __init__(self, results: list, unfinished: list[str]):
        super().__init__(f"{len(unfinished)} units unfinished")
        self.results, self.unfinished = results, unfinished


def execute(units: list[Unit], device: str, jobs: int, console, title: str) -> list:
    """Run the units (``jobs`` worker processes, or in this process for 1) with a progress bar
    titled ``title``; their results (``Unit.wrap``) in the order of ``units``, one list. Stopped
    (``KeyboardInterrupt``), it stops its workers and raises ``Interrupted`` with what finished:
    a run cut short by a lent GPU's time limit keeps its findings."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    results: list = [None] * len(units)
    finished: set[int] = set()
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress, threads(device):
        task = progress.add_task(title, total=len(units))
        def done(i: int) -> None:
            finished.add(i)
            progress.update(task, description=units[i].name)
            progress.advance(task)

        try:
            if jobs <= 1 and device == "cpu":
                for i, unit in enumerate(units):
                    results[i] = unit.fn(*unit.args, device)
                    done(i)
            else:
                pending = order(units)
                while pending:
                    left = _in_pool(units, pending, results, device, jobs, done)
                    if len(left) == len(pending):      # no unit finished: run each alone, to find the culprit
                        for i in left:
                            results[i] = _alone(units[i], device)
                            done(i)
                        left = []
                    pending = left
        except KeyboardInterrupt:
            progress.update(task, description=f"{title}: interrupted")
            raise Interrupted([r for i, unit in enumerate(units) if i in finished for r in unit.wrap(results[i])],
                              [unit.name for i, unit in enumerate(units) if i not in finished]) from None
        progress.update(task, description=f"{title}: done")
    return [r for unit, result in zip(units, results) for r in unit.wrap(result)]


def _in_pool(units: list[Unit], pending: list[int], results: list, device: str, jobs: int, done) -> list[int]:
    """Run the ``pending`` units in a pool of ``jobs`` processes; the units left unfinished when a
    worker process died (the pool breaks then), to run again."""
    lost = []
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(device, jobs))
    try:
        futures = {pool.submit(_run_unit, units[i].fn, units[i].args, device): i for i in pending}
        for future in as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except BrokenProcessPool:
                lost.append(i)
                continue
            done(i)
    except KeyboardInterrupt:
        # the executor has no public way to stop workers in the middle of a unit (shutdown waits for them)
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return lost


def _run_child(fn, args, device: str, queue) -> None:
    _init_worker(device)
    queue.put(fn(*args, device))


def _alone(unit: Unit, device: str):
    """Run one unit in a process of its own; its result, or ``unit.died`` with the exit status."""
    context = multiprocessing.get_context("spawn")
    queue = context.SimpleQueue()
    child = context.Process(target=_run_child, args=(unit.fn, unit.args, device, queue))
    child.start()
    child.join()
    if child.exitcode == 0 and not queue.empty():
        return queue.get()
    code = child.exitcode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
    return unit.died(f"the worker process running it died ({how}): the implementation crashed the process")


@contextmanager
def threads(device: str) -> Iterator[None]:
    """Run the grid on the CPU with one intra-op thread (restored afterwards).

    Grid tensors are tiny, so threads only add synchronisation: on 2 busy cores the float64
    sweep truths took 44 s with 2 threads and 9 s with one. One thread also makes the measured
    errors independent of the machine's core count (reductions split the same way everywhere).
    """
    import torch

    if device != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
