"""The checkpoint a lost harness may have sent (docs/architecture.md#custody, invariant 16): a
harness taking
the run over waits for pi's answer to it in the events file, or for the answer to an ``abort``
it sends on a soft stop or the deadline, never sending the summary command again; it takes the
compaction row only if pi wrote it and the mirror stored it, and stores a refusal as the
straight path does (the receipt with pi's reason, the run's context marked as needing recall).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio

from tether.clock import Clock
from tether.files import open_own
from tether.harness.checkpoint import RECEIPT_KIND, parse_receipt, store_refusal
from tether.harness.custody.markers import Marked, Markers
from tether.harness.stops import race_clock
from tether.harness.turn import CheckpointResult, CheckpointStatus
from tether.ledger import Fence, Ledger, ReceiptReason
from tether.mirror.mirror import Mirror
from tether.pi import keeper
from tether.threads import in_thread

__all__ = ["await_lost_checkpoint"]


def _events(run_dir: Path) -> bytes:
    """The events file the keeper wrote (never through a link, nor another file in its place:
    ``OSError``)."""
    with open_own(run_dir / keeper.EVENTS_NAME) as f:
        return f.read()


def _compact_response(run_dir: Path, sent_id: object) -> dict[str, Any] | None:
    """pi's answer to the lost harness's ``compact``, if it is in the events file."""
    try:
        data = _events(run_dir)
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


def _receipt(run_dir: Path, run: str) -> ReceiptReason | None:
    """The reason of the refusal receipt pi's extension reported for ``run`` (an error
    ``notify`` in the events file), if it did."""
    try:
        data = _events(run_dir)
    except OSError:
        return None
    found = None
    for line in data.split(b"\n"):
        if RECEIPT_KIND.encode() not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        found = parse_receipt(record, run) or found
    return found


async def await_lost_checkpoint(
    ledger: Ledger,
    fence: Fence,
    mirror: Mirror,
    run_dir: Path,
    clock: Clock,
    bound: float,
    *,
    abort_answered: anyio.Event,
    channel_ok: bool,
) -> CheckpointResult:
    """The checkpoint a lost harness sent: never sent again (invariant 16). Wait, to
    ``bound``, for pi's answer to it (in the events file) or for ``abort_answered`` (the
    driver sends ``abort`` on a soft stop or the deadline; pi answers once it is idle), and
    take the compaction row only if pi wrote it and the mirror stored it. A refusal is stored
    as the straight path stores it: a receipt row with pi's own reason, and the run's context
    marked as needing recall. With neither answer by ``bound`` (or pi gone without one) the
    checkpoint's outcome is unknown and the session refuses prompts."""
    sent = Markers(run_dir).sent_id(Marked.COMPACT)

    async def answered() -> None:
        while not abort_answered.is_set():
            if (
                _compact_response(run_dir, sent) is not None
                or (run_dir / keeper.EXIT_NAME).exists()
            ):
                return
            with anyio.move_on_after(0.05):
                await abort_answered.wait()

    await race_clock(clock, bound, answered)
    response = _compact_response(run_dir, sent)
    await mirror.sync()
    row = await in_thread(ledger.latest_compaction, fence.session)
    cont = row.body.get("continuation") if row is not None else None
    no_fifo = (
        None
        if channel_ok
        else f"pi's command FIFO of run {fence.run} is missing: no further prompts until it is "
        "checked"
    )
    if row is not None and row.run == fence.run and isinstance(cont, dict):
        await in_thread(
            ledger.update_run_extra,
            fence,
            {"checkpoint_seq": row.seq, "needs_recall": False, "checkpoint_by": "original"},
        )
        # Written, but pi cannot be ended in order without its FIFO: the session still refuses.
        return CheckpointResult(CheckpointStatus.WRITTEN, refuse_session=no_fifo)
    receipt = _receipt(run_dir, fence.run)
    reason = receipt or ReceiptReason.CANCELLED
    if response is not None or abort_answered.is_set():
        # pi answered: it is idle, and the refusal is what it reported. Which answer came is
        # kept: the compaction's own (an error) or, with none, the abort's.
        answered_by = "compaction" if response is not None else "abort"
        await in_thread(ledger.update_run_extra, fence, {"checkpoint_answered_by": answered_by})
        detail = None
        if receipt is None:
            detail = (
                "the checkpoint a lost harness sent was aborted"
                if response is None
                else f"pi refused the compaction: {response.get('error')}"
            )
        await store_refusal(mirror, ledger, fence, reason, detail)
        return CheckpointResult.refused(reason, no_fifo)
    await store_refusal(
        mirror, ledger, fence, reason, "pi did not answer the checkpoint a lost harness sent"
    )
    return CheckpointResult.refused(
        reason,
        f"run {fence.run}'s continuation checkpoint was sent by a lost harness and its "
        "outcome is unknown",
    )


async def settle_lost_checkpoint(
    ledger: Ledger, fence: Fence, mirror: Mirror, run_dir: Path
) -> dict[str, Any]:
    """What became of a checkpoint sent by a run whose harness and pi were both lost (a host
    crash, a ledger whose disk filled while the summary was made), recorded by whoever next
    owns the session, after ``mirror`` stored what pi wrote: ``written`` when pi's compaction
    is among it; otherwise refused, with pi's own reason if its extension reported one
    (``cancelled`` if not), as the straight path stores it: a receipt row, which the next
    view's notice names, and the run's context marked as needing recall. The run record's
    additions (none when no ``compact`` was sent, or its outcome is already recorded)."""
    if not Markers(run_dir).sent(Marked.COMPACT):
        return {}
    row = await in_thread(ledger.latest_compaction, fence.session)
    cont = row.body.get("continuation") if row is not None else None
    if row is not None and row.run == fence.run and isinstance(cont, dict):
        written = CheckpointResult(CheckpointStatus.WRITTEN)
        return {
            "checkpoint": written.label,
            "checkpoint_decision": written.record(),
            "checkpoint_seq": row.seq,
            "checkpoint_by": "original",
            "needs_recall": False,
        }
    recorded = await in_thread(ledger.get_run, fence.run)
    refused = CheckpointResult.refused(_receipt(run_dir, fence.run) or ReceiptReason.CANCELLED)
    extra: dict[str, Any] = {
        "checkpoint": refused.label,
        "checkpoint_decision": refused.record(),
        "needs_recall": True,
    }
    if recorded.extra.get("needs_recall") is not True:
        # Not stored before the harness was lost: the receipt and the detail now.
        extra["checkpoint_detail"] = (
            "the checkpoint was being made when the harness and pi were lost"
        )
        body = {"kind": RECEIPT_KIND, "run": fence.run, "reason": refused.why}
        with anyio.CancelScope(shield=True):
            await mirror.append_receipt(body)
    return extra
