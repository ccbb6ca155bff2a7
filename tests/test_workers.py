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
