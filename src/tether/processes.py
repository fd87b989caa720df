"""Processes named by pid and start time, so that a reused pid is never taken for the process
it once named (docs/architecture.md#custody: placements, cleanup signals).

A start time here is seconds since boot, the kernel's own record (``starttime`` in
``/proc/PID/stat``, in clock ticks). The wall-clock start that ``psutil`` reports is that plus
the boot time, which the kernel recomputes on every read from the current clock: a clock step
(a host that resets a virtual machine's clock, a time daemon's correction) moves every process's
wall-clock start at once, and a process compared with what was recorded before the step would
look gone. A start time since boot never moves.
"""

from __future__ import annotations

import os

__all__ = ["alive", "start_time"]

_PROC = os.path.isdir("/proc/self")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_TOLERANCE_S = 0.5 / _TICKS if _PROC else 0.05
_WALL_CLOCK_TOLERANCE_S = 0.05
_WALL_CLOCK_FLOOR = 1e9
"""Start times recorded as wall-clock seconds (before tether recorded them since boot) are
past this (2001); no machine has been up that long."""


def start_time(pid: object) -> float | None:
    """When ``pid`` started, in seconds since boot, or None if no such live process (a zombie,
    exited and not yet reaped, counts as gone)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if not _PROC:
        return _start_time_psutil(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ... starttime ...": comm may hold spaces and parentheses, so the fields
    # are counted from the last ")"; starttime is the 22nd field, the 20th after comm.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19]) / _TICKS


def alive(pid: object, start: object) -> bool:
    """True when ``pid`` is alive and is the process that started at ``start`` (a start time
    from :func:`start_time`). A wall-clock start time, recorded by an earlier tether, is
    compared with the wall-clock start, as it was then."""
    if not isinstance(start, int | float) or isinstance(start, bool):
        return False
    found = start_time(pid)
    if found is None:
        return False
    if start >= _WALL_CLOCK_FLOOR:
        assert isinstance(pid, int)  # start_time found it
        return _wall_clock_matches(pid, float(start))
    return abs(found - float(start)) <= _TOLERANCE_S


def _wall_clock_matches(pid: int, start: float) -> bool:
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - start) <= _WALL_CLOCK_TOLERANCE_S
    except psutil.Error:
        return False


def _start_time_psutil(pid: int) -> float | None:
    """Without ``/proc``: psutil's wall-clock start less the boot time (read twice, so a clock
    step between the two reads can still move it)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time() - psutil.boot_time())
    except psutil.Error:
        return None
