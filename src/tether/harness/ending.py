"""A run's end: the verdict drawn from the values the phases returned, the end record written
once (retried while the ledger fails, kept on disk when it never takes it), the session's
refusal, and the outcome (docs/cli.md#tether-run, invariant 14: whatever answer exists is kept).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec

from tether.errors import LedgerError, RunNotActive, StorageError
from tether.events import EventBus, RunEnded
from tether.files import remove_later
from tether.harness.context import ClaimedRun, Progress
from tether.harness.pump import RunState
from tether.harness.rundir import runs_dir
from tether.harness.stops import Stopped, StopReason
from tether.harness.storage import StorageRetry
from tether.harness.stranded import keep_stranded_end
from tether.harness.turn import CheckpointResult, RunOutcome, TaskEnd, verdict
from tether.ledger import Fence, Ledger, RunStatus
from tether.ledger.models import now_iso
from tether.mirror.mirror import Mirror
from tether.sandbox.limits import LimitHit
from tether.threads import in_thread
from tether.usage import RunUsage

__all__ = ["PiEnded", "RunEnd", "RunEnder", "drive_recorded"]


class PiRecord(msgspec.Struct, kw_only=True):
    version: str
    exit_status: int | None


class Strays(msgspec.Struct, kw_only=True):
    count: int
    samples: list[str]


class RunEnd(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The run record's ``extra`` at its end (the keys after ``ended_by_harness`` only when
    they say something)."""

    stop_reason: str
    answer: str | None
    error: str | None
    checkpoint: str
    turns: int
    tool_calls: int
    retries: int
    omitted_attempts: int
    pi: PiRecord
    log: str
    ended_by_harness: str
    view: dict[str, Any] | None = None
    escalated: bool = False
    strays: Strays | None = None
    extension_errors: list[str] = []
    mirror_problems: list[str] = []
    storage_retries: int = 0
    checkpoint_decision: dict[str, str | None] | None = None
    """``{"decision": written | refused | not_tried, "reason": …}`` (docs/operations.md#traces)."""
    limits_hit: list[LimitHit] = []
    """The sandbox limits the run's tools hit (docs/security.md), each ``{"limit": processes |
    memory | file_size, "tool", "seq", "evidence"}``; absent when they hit none."""
    usage: dict[str, Any] | None = None
    """What pi reported the run's provider calls used, the task turn's and the checkpoint's
    summary call apart (tether.usage: ``{"model", "provider", "task": {…}, "checkpoint":
    {…}}``); the ledger's usage rows are written from it with the run's end."""

    def to_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = msgspec.to_builtins(self)
        return extra


class PiEnded(msgspec.Struct, frozen=True):
    """What the task turn and the checkpoint came to, and how pi left."""

    task: TaskEnd
    checkpoint: CheckpointResult
    late: Stopped | None
    """A stop that landed during the checkpoint."""
    exit_status: int | None
    diagnostics: str
    """pi's last stderr lines."""
    lost: str | None = None
    """Why pi's transport was lost beyond recovery (its keeper died): the session refuses."""


def _with_stderr(message: str | None, reason: StopReason, diagnostics: str) -> str | None:
    tail = [line for line in diagnostics.splitlines() if line.strip()][-3:]
    if message and reason in (StopReason.STARTUP_FAILED, StopReason.TRANSPORT_LOST) and tail:
        message += " | pi's stderr: " + " / ".join(tail)
    return message


class RunEnder:
    """Ends one run, once."""

    def __init__(self, run: ClaimedRun, storage: StorageRetry) -> None:
        self.run = run
        self.storage = storage
        self._recorded = False
        self._tried = False

    async def conclude(
        self,
        ended: PiEnded,
        *,
        state: RunState,
        progress: Progress,
        mirror: Mirror,
        log_path: Path,
        view_record: dict[str, Any] | None,
        usage: RunUsage | None = None,
    ) -> RunOutcome:
        run, fence, checkpoint = self.run, self.run.fence, ended.checkpoint
        found = verdict(ended.task, late=ended.late, failure=progress.failure, grace_s=run.grace)
        error = _with_stderr(found.error, found.stop_reason, ended.diagnostics)
        escalated = isinstance(ended.task, Stopped) and ended.task.escalated
        # A run that ended well leaves nothing behind; any other keeps its directory to look at.
        keep = (
            found.status is not RunStatus.FINISHED or escalated or bool(checkpoint.refuse_session)
        )
        if keep and error:
            error += f" (pi's log and session file are kept in {run.run_dir})"
        end = RunEnd(
            stop_reason=found.stop_reason.value,
            answer=state.answer,
            error=error,
            checkpoint=checkpoint.label,
            turns=state.turns,
            tool_calls=state.tool_calls,
            retries=state.retries,
            omitted_attempts=mirror.omitted_attempts,
            pi=PiRecord(version=run.pi.version, exit_status=ended.exit_status),
            log=str(log_path),
            ended_by_harness=now_iso(),
            view=view_record,
            escalated=escalated,
            strays=Strays(count=state.strays, samples=state.stray_samples)
            if state.strays
            else None,
            extension_errors=state.extension_errors[:10],
            mirror_problems=mirror.problems[:10],
            storage_retries=self.storage.retries,
            checkpoint_decision=checkpoint.record(),
            limits_hit=mirror.limits_hit,
            usage=usage.to_json() if usage is not None else None,
        )
        if found.stop_reason is not StopReason.FENCED_OUT:
            refusing = checkpoint.refuse_session
            if escalated:
                refusing = (
                    f"pi's idle was not confirmed when run {fence.run} stopped "
                    f"({found.stop_reason.value})"
                )
            if ended.lost and not refusing:
                refusing = (
                    f"run {fence.run} lost pi's transport ({ended.lost}); pi and its tools were "
                    "ended, and what they did last is unknown: check, then clear the session"
                )
            extra = end.to_extra()
            with anyio.CancelScope(shield=True):
                try:
                    await self.storage.retried(
                        functools.partial(self._record, found.status, extra, refusing)
                    )
                except StorageError as exc:
                    # No run is left running: the end waits in the runs directory, and the
                    # next run on this ledger records it.
                    where = keep_stranded_end(
                        runs_dir(run.config), fence, found.status, extra, refusing
                    )
                    error = (
                        f"{error or f'the ledger could not be written ({exc})'}; the run's end "
                        f"could not be recorded either: it is kept in {where}, and the next run "
                        "records it"
                    )
        if not keep:
            remove_later(run.run_dir)
        return RunOutcome(
            run=fence.run,
            session=fence.session,
            status=found.status,
            stop_reason=found.stop_reason,
            answer=state.answer,
            checkpoint=checkpoint,
            error=error,
            run_dir=run.run_dir,
            follow_up=view_record is not None,
        )

    async def _record(self, status: RunStatus, extra: dict[str, Any], refusing: str | None) -> None:
        # Retried as a whole while the ledger fails: an end already written is not written
        # again (that would raise RunNotActive and lose the refusal after it).
        ledger, fence = self.run.ledger, self.run.fence
        if not self._recorded:
            try:
                await in_thread(ledger.end_run, fence, status, extra=extra)
            except RunNotActive:
                # A try before this one failed as its commit's acknowledgement was lost.
                if not self._tried:
                    raise
            finally:
                self._tried = True
            self._recorded = True
        if refusing:
            await in_thread(ledger.set_refusing, fence.session, refusing)


async def drive_recorded(
    drive: Awaitable[RunOutcome],
    *,
    ledger: Ledger,
    fence: Fence,
    bus: EventBus,
    answer: Callable[[], str | None],
) -> RunOutcome:
    """Await the driven run; a run cancelled from outside, or cut short by a bug, has its end
    recorded (with ``answer()``, whatever answer exists) before the exception goes on."""
    try:
        outcome = await drive
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            status = (
                RunStatus.INTERRUPTED
                if isinstance(exc, anyio.get_cancelled_exc_class())
                else RunStatus.FAILED
            )
            with contextlib.suppress(LedgerError):
                await in_thread(
                    ledger.end_run,
                    fence,
                    status,
                    extra={"error": f"the harness stopped: {exc!r}", "answer": answer()},
                )
        raise
    bus.emit(
        RunEnded(
            run=outcome.run,
            status=outcome.status.value,
            stop_reason=outcome.stop_reason.value,
            answer=outcome.answer,
            error=outcome.error,
        )
    )
    return outcome
