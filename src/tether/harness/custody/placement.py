"""Where a live run is held (docs/architecture.md#custody): this host's id, this harness process,
pi's process.

The host id is ``$TETHER_HOST_ID`` when set (containers that share a hostname, tests that play
two hosts), else ``/etc/machine-id``, else the hostname. A placement records pids together with
their start times (seconds since boot: :mod:`tether.processes`), so a reused pid is never taken
for the process it once named.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any

from tether.processes import alive, start_time

__all__ = ["harness_gone", "host_id", "owner_id", "placement"]


def host_id() -> str:
    chosen = os.environ.get("TETHER_HOST_ID")
    if chosen:
        return chosen
    return _machine_id()


@functools.cache
def _machine_id() -> str:
    try:
        found = Path("/etc/machine-id").read_text().strip()
    except OSError:
        found = ""
    return f"{socket.gethostname()}:{found[:12]}" if found else socket.gethostname()


@functools.cache
def _me() -> tuple[int, float | None]:
    pid = os.getpid()
    return pid, start_time(pid)


def owner_id() -> str:
    """The lease owner this process writes: host and pid."""
    return f"{host_id()}/{os.getpid()}"


def placement(*, pi: dict[str, Any] | None, run_dir: Path) -> dict[str, Any]:
    """This harness's placement of a run: the host, the harness process, pi and its keeper."""
    pid, start = _me()
    out: dict[str, Any] = {
        "host": host_id(),
        "harness_pid": pid,
        "harness_start": start,
        "run_dir": str(run_dir),
    }
    if pi:
        for key in ("pi_pid", "pi_start", "keeper_pid", "keeper_start"):
            if key in pi:
                out[key] = pi[key]
    return out


def harness_gone(recorded: dict[str, Any] | None) -> bool:
    """On this host, the harness that recorded the placement is confirmed gone."""
    if not recorded or recorded.get("host") != host_id():
        return False
    return not alive(recorded.get("harness_pid"), recorded.get("harness_start"))
