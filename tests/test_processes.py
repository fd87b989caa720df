"""Processes named by pid and start time (tether.processes): a clock step moves no recorded
start, a reused pid or a zombie never passes for the process that was recorded.

The clock step is injected where the kernel shows it: /proc/stat's boot time, which the kernel
recomputes from the current wall clock on every read and which psutil adds to each process's
start. Here psutil's reading of it is moved by one second, as a stepped clock moves it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psutil._pslinux
import pytest

from support import wait_for
from tether.harness.custody import placement
from tether.processes import alive, start_time


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def clock_step(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Step the wall clock one second forward (as the boot time shows it)."""
    real = psutil._pslinux.boot_time

    def step() -> None:
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real() + 1.0)

    return step


def test_a_start_time_is_the_kernels_own_and_names_only_that_process(
    child: subprocess.Popen[bytes],
) -> None:
    started = start_time(child.pid)
    assert started is not None
    assert started == pytest.approx(
        psutil.Process(child.pid).create_time() - psutil.boot_time(), abs=0.02
    )
    assert alive(child.pid, started)
    # The same pid with another start time is another process (the pid was reused).
    assert not alive(child.pid, started - 1.0)
    assert not alive(child.pid, None)
    assert start_time(True) is None
    assert start_time(-1) is None


def test_a_zombie_is_gone() -> None:
    proc = subprocess.Popen(["true"])
    started = start_time(proc.pid)
    zombie = psutil.STATUS_ZOMBIE
    wait_for(lambda: psutil.Process(proc.pid).status() == zombie, 10, "the child to exit")
    try:
        assert start_time(proc.pid) is None
        assert not alive(proc.pid, started)
    finally:
        proc.wait()
    assert start_time(proc.pid) is None


def test_a_clock_step_leaves_a_live_process_alive(
    child: subprocess.Popen[bytes], clock_step: Callable[[], None]
) -> None:
    recorded = start_time(child.pid)
    wall = psutil.Process(child.pid).create_time()
    clock_step()
    # The step is real to psutil: its wall-clock start moved by a second ...
    assert psutil.Process(child.pid).create_time() == pytest.approx(wall + 1.0, abs=0.02)
    # ... and the start since boot did not.
    assert start_time(child.pid) == recorded
    assert alive(child.pid, recorded)


def test_a_clock_step_leaves_this_harness_in_custody_of_its_runs(
    clock_step: Callable[[], None],
) -> None:
    # This process holds a run; after the step, another worker on this host asks whether the
    # holder is gone (a yes would take the run over while it runs here).
    where = placement.placement(pi=None, run_dir=Path("/nonexistent"))
    clock_step()
    assert not placement.harness_gone(where)


def test_a_wall_clock_start_from_an_earlier_tether_is_compared_as_it_was_recorded(
    child: subprocess.Popen[bytes],
) -> None:
    wall = psutil.Process(child.pid).create_time()
    assert alive(child.pid, wall)
    assert not alive(child.pid, wall - 1.0)
