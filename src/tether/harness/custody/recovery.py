"""The checkpoint a lost harness may have sent (DESIGN §3.7, invariant 16): a harness taking
the run over waits for pi's answer to it in the events file, never sending it again, and takes
the compaction row only if pi wrote it and the mirror stored it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio

from tether.clock import Clock
from tether.harness.custody.markers import Marked, Markers
from tether.harness.turn import CheckpointResult, CheckpointStatus
from tether.ledger import Fence, Ledger, ReceiptReason
from tether.mirror.mirror import Mirror
from tether.pi import keeper
from tether.threads import in_thread

__all__ = ["await_lost_checkpoint"]


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
    sent = Markers(run_dir).sent_id(Marked.COMPACT)
    response = None
    while clock.now() < deadline:
        response = _compact_response(run_dir, sent)
        if response is not None or (run_dir / keeper.EXIT_NAME).exists():
            break
        await anyio.sleep(0.05)
    await mirror.sync()
    row = await in_thread(ledger.latest_compaction, fence.session)
    cont = row.body.get("continuation") if row is not None else None
    if row is not None and row.run == fence.run and isinstance(cont, dict):
        await in_thread(
            ledger.update_run_extra,
            fence,
            {"checkpoint_seq": row.seq, "needs_recall": False, "checkpoint_by": "original"},
        )
        return CheckpointResult(CheckpointStatus.WRITTEN)
    if response is None:
        return CheckpointResult.refused(
            ReceiptReason.CANCELLED,
            f"run {fence.run}'s continuation checkpoint was sent by a lost harness and its "
            "outcome is unknown",
        )
    return CheckpointResult.refused(ReceiptReason.CANCELLED)
