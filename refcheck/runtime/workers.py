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
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, NoReturn

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
    at most ``MAX_GPU_JOBS`` per GPU of the host (where a cold run is bound by compiling, one core
    each, and the processes of one GPU share its memory)."""
    return max(1, min(MAX_JOBS if device == "cpu" else MAX_GPU_JOBS * gpu_count(), cores()))


def gpu_count() -> int:
    """The GPUs this process sees (``CUDA_VISIBLE_DEVICES``), at least 1."""
    import torch
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def gpu_of(worker: int, gpus: int) -> int:
    """The GPU of worker ``worker`` (0, 1, ...) on a host with ``gpus``: the workers go round the GPUs."""
    return worker % max(1, gpus)


def pin_gpu(worker: int) -> int | None:
    """Make GPU ``gpu_of(worker, ...)`` this process's current CUDA device, before it allocates on it
    (tensors made on "cuda" go there); its index, or None without a GPU. One process, one GPU: a
    kernel that loses the CUDA context takes one worker of one GPU with it."""
    import torch
    if not torch.cuda.is_available():
        return None
    index = gpu_of(worker, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return index


def cores() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_process(device: str, jobs: int) -> int:
    """Intra-op threads for each of ``jobs`` worker processes: one on the CPU (interpreted kernels
    and tiny tensors: more threads only synchronise), on a GPU run a share of the cores, which
    compute the float64 references (``refcheck.engine.verify.REFERENCE_DEVICE``)."""
    return 1 if device == "cpu" else max(1, cores() // max(1, jobs))


def _init_worker(device: str, jobs: int = 1, slot: int = 0) -> None:
    """Worker ``slot`` of ``jobs``: the backend before any kernel is imported, its intra-op threads,
    on a GPU its own GPU (``pin_gpu``) and its share of that GPU's memory."""
    import torch

    from .backend import configure_backend
    global _IN_WORKER
    _IN_WORKER = True
    configure_backend(device)
    torch.set_num_threads(threads_per_process(device, jobs))
    if torch.device(device).type == "cuda":
        share_gpu(slot, jobs)


def share_gpu(slot: int, jobs: int) -> None:
    """Worker ``slot`` of ``jobs`` on a GPU host: its own GPU (``pin_gpu``) and its share of that GPU's
    memory (``GPU_MEMORY_SHARE``)."""
    import torch
    pin_gpu(slot)
    sharing = -(-jobs // gpu_count())           # the workers on this GPU
    if sharing > 1:
        torch.cuda.set_per_process_memory_fraction(GPU_MEMORY_SHARE / sharing)


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
    """After a unit on a GPU: wait for its kernels and give back the memory it cached. A unit that
    lost the process's CUDA context (``context_lost``) ends the worker at once with status
    ``CONTEXT_LOST``: the unit's result is its crash (``Unit.died``), and a fresh worker takes the
    next unit. (Seen on an H100: an illegal address in a warm-up unit, raised from ``empty_cache``
    here, once ended a whole pytest session.)"""
    import torch
    if context_lost("cuda"):
        os._exit(CONTEXT_LOST)
    torch.cuda.empty_cache()


def context_lost(device: str) -> bool:
    """Whether the process's CUDA context on ``device`` is unusable: a kernel made an illegal memory
    access or failed a device-side assert, and every later CUDA call raises (synchronizing, first)."""
    import torch
    if torch.device(device).type != "cuda":
        return False
    try:
        torch.cuda.synchronize()
    except Exception:       # torch.AcceleratorError (a RuntimeError)
        return True
    return False


def failed_launch(err: BaseException) -> str | None:
    """The Triton kernel whose launch raised ``err`` (or an exception it was raised from): its name,
    read from the launching frame of ``triton.runtime.jit``; None when no launch is in the traceback.
    CUDA reports a kernel's fault at a later call unless launches are synchronous
    (``CUDA_LAUNCH_BLOCKING=1``), so the name is the faulty kernel's only then."""
    seen = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = None
        for frame, _ in traceback.walk_tb(current.__traceback__):
            kernel = frame.f_locals.get("self") if frame.f_code.co_name == "run" else None
            fn = getattr(kernel, "fn", None)
            if "triton" in frame.f_code.co_filename and callable(fn):
                name = f"{fn.__module__}.{fn.__name__}"
        if name:
            return name
        current = current.__cause__ or current.__context__
    return None


def crash_site(err: BaseException) -> str:
    """A phrase for a failure message naming the kernel a lost CUDA context surfaced at
    (``failed_launch``), and whether it is certainly the one at fault: '' when no launch is known."""
    name = failed_launch(err)
    if name is None:
        return ""
    if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1":
        return f" in {name}"
    return f" (surfaced at the launch of {name}; CUDA_LAUNCH_BLOCKING=1 names the kernel at fault)"


FAILURE_DIR_ENV = "REFCHECK_FAILURE_DIR"
"""A folder where each failure is written the moment it happens (a run a time limit cuts short
keeps what it found): pytest's failed tests, and the examples that lost a worker's CUDA context."""


_IN_WORKER = False
"""Set in the worker processes of ``execute`` (``_init_worker``)."""


def in_worker_process() -> bool:
    """Whether this process is a worker that its run replaces when it ends: one of ``execute``'s, or a
    pytest-xdist worker. Elsewhere (a reproducer, a user's own session) a lost CUDA context is raised,
    not ended on."""
    return _IN_WORKER or "PYTEST_XDIST_WORKER" in os.environ


def end_lost_process(message: str) -> NoReturn:
    """End a process whose CUDA context a kernel lost, after saying why: ``message`` (the failure,
    with its reproducer) goes to stderr and to a file in ``REFCHECK_FAILURE_DIR``, then the
    process exits with ``CONTEXT_LOST``. Nothing after a lost context could run on this GPU, and
    Hypothesis would go on shrinking an example that no longer matters (every call raises now):
    the example that crashed is the finding. Its pool or pytest-xdist replaces the worker."""
    print(message, file=sys.stderr, flush=True)
    folder = os.environ.get(FAILURE_DIR_ENV)
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"cuda-context-lost-{os.getpid()}.txt"), "w") as fh:
            fh.write(message + "\n")
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
                _in_workers(units, results, device, jobs, done)
        except KeyboardInterrupt:
            progress.update(task, description=f"{title}: interrupted")
            raise Interrupted([r for i, unit in enumerate(units) if i in finished for r in unit.wrap(results[i])],
                              [unit.name for i, unit in enumerate(units) if i not in finished]) from None
        progress.update(task, description=f"{title}: done")
    return [r for unit, result in zip(units, results) for r in unit.wrap(result)]


class _Worker:
    """A worker process and the unit it runs (``busy``: its index, or None when idle)."""

    def __init__(self, context, device: str, jobs: int, slot: int):
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, device, jobs, slot), daemon=True)
        self.process.start()
        theirs.close()
        self.busy: int | None = None

    def give(self, i: int, unit: Unit) -> None:
        self.busy = i
        self.conn.send((i, unit.fn, unit.args))

    def stop(self) -> None:
        """An idle worker is told to stop and exits; one still in a unit (the run was interrupted) is
        terminated."""
        if self.busy is None and self.process.is_alive():
            try:
                self.conn.send(None)
                self.process.join(timeout=10)
            except OSError:             # its pipe is gone: it has died meanwhile
                pass
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()


def _serve(conn, device: str, jobs: int, slot: int) -> None:
    """Worker process ``slot``: runs the units it is sent, one at a time, until told to stop (None)."""
    _init_worker(device, jobs, slot)
    while (task := conn.recv()) is not None:
        i, fn, args = task
        try:
            conn.send((i, True, _run_unit(fn, args, device)))
        except Exception as err:        # the caller raises it, as a unit's own exception
            try:
                conn.send((i, False, err))
            except Exception:           # an exception that does not pickle: its text
                conn.send((i, False, RuntimeError(f"{type(err).__name__}: {err}\n{traceback.format_exc()}")))


def _in_workers(units: list[Unit], results: list, device: str, jobs: int, done) -> None:
    """Run every unit in ``jobs`` worker processes, in ``order``, each worker one unit at a time. A
    worker that dies (a segfault, an abort, a lost CUDA context) costs only the unit it ran: that
    unit's result is ``Unit.died``, and a fresh worker takes the next unit. On a host with several
    GPUs worker i runs on GPU ``i mod GPUs``."""
    context = multiprocessing.get_context("spawn")
    queue = order(units)
    workers = [_Worker(context, device, jobs, slot) for slot in range(min(jobs, len(queue)))]
    try:
        for worker in workers:
            worker.give(first := queue.pop(0), units[first])
        while busy := [w for w in workers if w.busy is not None]:
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for worker in busy:
                i = worker.busy
                assert i is not None
                reply = _receive(worker.conn) if worker.conn in ready else None
                if reply is not None:
                    _, ok, value = reply
                    if not ok:
                        raise value
                    results[i] = value
                elif worker.conn in ready or worker.process.sentinel in ready:    # its pipe closed: it died
                    worker.process.join()
                    results[i] = units[i].died(_death(worker.process.exitcode))
                    slot = workers.index(worker)                # its replacement takes its GPU
                    workers[slot] = worker = _Worker(context, device, jobs, slot)
                else:
                    continue
                worker.busy = None
                done(i)
                if queue:
                    worker.give(j := queue.pop(0), units[j])
    finally:
        for worker in workers:
            worker.stop()


def _receive(conn):
    """A worker's reply, or None when its end of the pipe closed (the process died)."""
    try:
        return conn.recv()
    except EOFError:
        return None


def _death(code: int | None) -> str:
    """What a worker's exit status says about the unit it ran."""
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
    if code == CONTEXT_LOST:
        how += ": it lost the CUDA context, an illegal memory access or a device-side assert"
    return f"the worker process running it died ({how}): the implementation crashed the process"


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
