"""Running the grid's work in worker processes, shared by ``refcheck report`` and ``drift record``.

Interpreted Triton kernels are single-threaded Python, so on the CPU the work is spread over
spawned processes (each configures the backend before any kernel module is imported); on a GPU one
process is best. Work comes as ``Unit``s; results come back in the order of the units, whatever
order the processes finish in, so a run does not depend on ``jobs``.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

MAX_JOBS = 4


@dataclass
class Unit:
    """A unit of work: ``fn(*args, device)`` runs in a worker and returns plain (picklable) data,
    ``wrap`` turns that into results; ``cost`` orders the units (largest first, so that the pool is
    not left waiting on one long unit at the end)."""

    name: str
    fn: Callable
    args: tuple
    cost: float
    wrap: Callable[[object], list]


def default_jobs(device: str) -> int:
    """Worker processes: 1 on a GPU, else the usable cores, at most ``MAX_JOBS``."""
    if device != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_JOBS, cores))


def _init_worker(device: str) -> None:
    """A worker process: the backend before any kernel is imported, one intra-op thread."""
    import torch

    from .backend import configure_backend
    configure_backend(device)
    torch.set_num_threads(1)


def execute(units: list[Unit], device: str, jobs: int, console, title: str) -> list:
    """Run the units (``jobs`` worker processes, or in this process for 1) with a progress bar
    titled ``title``; their results (``Unit.wrap``) in the order of ``units``, one list."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import grid

    results: list = [None] * len(units)
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress, grid.threads(device):
        task = progress.add_task(title, total=len(units))
        if jobs <= 1:
            for i, unit in enumerate(units):
                progress.update(task, description=unit.name)
                results[i] = unit.fn(*unit.args, device)
                progress.advance(task)
        else:
            order = sorted(range(len(units)), key=lambda i: -units[i].cost)
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_init_worker, initargs=(device,)) as pool:
                futures = {pool.submit(units[i].fn, *units[i].args, device): i for i in order}
                for future in as_completed(futures):
                    i = futures[future]
                    results[i] = future.result()
                    progress.update(task, description=units[i].name)
                    progress.advance(task)
        progress.update(task, description=f"{title}: done")
    return [r for unit, result in zip(units, results) for r in unit.wrap(result)]
