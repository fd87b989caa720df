"""Where a live run is held (DESIGN §3.7): this host's id, this harness process, pi's process.

The host id is ``$TETHER_HOST_ID`` when set (containers that share a hostname, tests that play
two hosts), else ``/etc/machine-id``, else the hostname. A placement records pids together with
their start times (seconds since boot: :mod:`tether.processes`), so a reused pid is never taken
for the process it once named.
"""

from __future__ import annotations

import functools
import json
import os
import socket
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from tether.clock import Clock
from tether.harness.turn import CheckpointResult, CheckpointStatus
from tether.ledger import Fence, Ledger, ReceiptReason
from tether.mirror.mirror import Mirror
from tether.pi import keeper
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


RUN_STATE = "custody.json"


def save_run_state(run_dir: Path, state: dict[str, Any]) -> None:
    """What a harness taking the run over needs (the mirror's start, the request row, the
    deadline), written atomically, 0600."""
    tmp = run_dir / (RUN_STATE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, run_dir / RUN_STATE)


def load_run_state(run_dir: Path) -> dict[str, Any]:
    data = json.loads((run_dir / RUN_STATE).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{run_dir / RUN_STATE} is not a JSON object")
    return data


def _compact_response(run_dir: Path, sent_id: object) -> dict[str, Any] | None:
    """pi's answer to the lost harness's ``compact``, if it is in the events file."""
    try:
        data = (run_dir / keeper.EVENTS_NAME).read_bytes()
    except OSError:
        return None
    for line in data.split(b"\n"):
        if b'"compact"' not in line or b'"response"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and record.get("type") == "response"
            and record.get("command") == "compact"
            and record.get("id") == sent_id
        ):
            return record
    return None


async def await_lost_checkpoint(
    ledger: Ledger,
    fence: Fence,
    mirror: Mirror,
    run_dir: Path,
    clock: Clock,
    deadline: float,
) -> CheckpointResult:
    """The checkpoint a lost harness sent: wait (to the run's deadline) for pi's answer to it,
    never sending it again (invariant 16), and take the compaction row only if pi wrote it
    and the mirror stored it. Otherwise the checkpoint stays unacknowledged."""
    try:
        sent = json.loads((run_dir / "compact.sent").read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        sent = None
    response = None
    while clock.now() < deadline:
        response = _compact_response(run_dir, sent)
        if response is not None or (run_dir / keeper.EXIT_NAME).exists():
            break
        await anyio.sleep(0.05)
    await mirror.sync()
    row = await anyio.to_thread.run_sync(ledger.latest_compaction, fence.session)
    cont = row.body.get("continuation") if row is not None else None
    if row is not None and row.run == fence.run and isinstance(cont, dict):
        await anyio.to_thread.run_sync(
            functools.partial(
                ledger.update_run_extra,
                fence,
                {"checkpoint_seq": row.seq, "needs_recall": False, "checkpoint_by": "original"},
            )
        )
        return CheckpointResult(CheckpointStatus.WRITTEN)
    if response is None:
        return CheckpointResult.refused(
            ReceiptReason.CANCELLED,
            f"run {fence.run}'s continuation checkpoint was sent by a lost harness and its "
            "outcome is unknown",
        )
    return CheckpointResult.refused(ReceiptReason.CANCELLED)
