"""tether's own run events: the small union the mirror, the CLI and the service subscribe to.

pi's event stream is rich and versioned; these are the facts about a run that tether's own
consumers need, in tether's words. Subscribers are plain callables, called in order from the
run's task; they must be quick and must not raise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = [
    "AnswerDelta",
    "Compacted",
    "Compacting",
    "EventBus",
    "Notice",
    "PiStarted",
    "Resumed",
    "Retrying",
    "RowsMirrored",
    "RunEnded",
    "RunEvent",
    "RunStarted",
    "Settled",
    "StopRequested",
    "StrayOutput",
    "Subscriber",
    "ToolFinished",
    "ToolStarted",
    "TurnStarted",
    "Waiting",
]

log = logging.getLogger(__name__)


class Waiting(msgspec.Struct, frozen=True):
    """A queued run waits for its session's live run to end (docs/architecture.md#custody)."""

    run: str
    behind: str | None
    """The live run it waits for (None when only earlier queued runs are ahead)."""
    session: str


class Resumed(msgspec.Struct, frozen=True):
    """A run whose harness was lost is taken over on its original pi process
    (docs/architecture.md#custody)."""

    run: str
    session: str
    pi_pid: int


class RunStarted(msgspec.Struct, frozen=True):
    run: str
    session: str
    agent: str
    follow_up: bool


class PiStarted(msgspec.Struct, frozen=True):
    pid: int
    version: str


class TurnStarted(msgspec.Struct, frozen=True):
    turn: int
    """1-based count of assistant turns in this run."""


class AnswerDelta(msgspec.Struct, frozen=True):
    text: str
    """A piece of assistant text as it streams."""


class ToolStarted(msgspec.Struct, frozen=True):
    call_id: str
    name: str
    args: Any


class ToolFinished(msgspec.Struct, frozen=True):
    call_id: str
    name: str
    is_error: bool
    duration_ms: float | None


class Retrying(msgspec.Struct, frozen=True):
    attempt: int
    max_attempts: int
    error: str


class Compacting(msgspec.Struct, frozen=True):
    reason: str


class Compacted(msgspec.Struct, frozen=True):
    reason: str
    ok: bool
    aborted: bool
    error: str | None


class Notice(msgspec.Struct, frozen=True):
    """An extension's ``ctx.ui.notify``."""

    level: str
    message: str


class StrayOutput(msgspec.Struct, frozen=True):
    """pi wrote a line to stdout that is not protocol."""

    line: str
    problem: str


class RowsMirrored(msgspec.Struct, frozen=True):
    """Rows the mirror made visible in the ledger, with when pi created each entry."""

    seqs: tuple[int, ...]
    entry_ids: tuple[str, ...]
    written_at: float
    """Wall-clock seconds (time.time()) right after the fenced write committed."""
    entry_times: tuple[float, ...]
    """Each entry's own timestamp (wall-clock seconds, from pi)."""


class StopRequested(msgspec.Struct, frozen=True):
    reason: str
    hard: bool


class Settled(msgspec.Struct, frozen=True):
    aborted: bool


class RunEnded(msgspec.Struct, frozen=True):
    run: str
    status: str
    stop_reason: str
    answer: str | None
    error: str | None


RunEvent = (
    Waiting
    | Resumed
    | RunStarted
    | PiStarted
    | TurnStarted
    | AnswerDelta
    | ToolStarted
    | ToolFinished
    | Retrying
    | Compacting
    | Compacted
    | Notice
    | StrayOutput
    | RowsMirrored
    | StopRequested
    | Settled
    | RunEnded
)

Subscriber = Callable[[RunEvent], None]


class EventBus:
    def __init__(self, subscribers: list[Subscriber] | None = None) -> None:
        self._subscribers: list[Subscriber] = list(subscribers or [])

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    def emit(self, event: RunEvent) -> None:
        for fn in self._subscribers:
            try:
                fn(event)
            except Exception:  # a broken display must not break the run: log it, go on
                log.exception("run event subscriber %r failed on %r", fn, event)
