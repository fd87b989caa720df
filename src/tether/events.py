"""tether's own run events: the small union the mirror, the CLI and the service subscribe to.

pi's event stream is rich and versioned; these are the facts about a run that tether's own
consumers need, in tether's words. Subscribers are plain callables, called in order from the
run's task; they must be quick and must not raise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued run waits for its session's live run to end (DESIGN §3.7)."""

    run: str
    behind: str | None
    """The live run it waits for (None when only earlier queued runs are ahead)."""
    session: str


@dataclass(frozen=True, slots=True)
class Resumed:
    """A run whose harness was lost is taken over on its original pi process (DESIGN §3.7)."""

    run: str
    session: str
    pi_pid: int


@dataclass(frozen=True, slots=True)
class RunStarted:
    run: str
    session: str
    agent: str
    follow_up: bool


@dataclass(frozen=True, slots=True)
class PiStarted:
    pid: int
    version: str


@dataclass(frozen=True, slots=True)
class TurnStarted:
    turn: int
    """1-based count of assistant turns in this run."""


@dataclass(frozen=True, slots=True)
class AnswerDelta:
    text: str
    """A piece of assistant text as it streams."""


@dataclass(frozen=True, slots=True)
class ToolStarted:
    call_id: str
    name: str
    args: Any


@dataclass(frozen=True, slots=True)
class ToolFinished:
    call_id: str
    name: str
    is_error: bool
    duration_ms: float | None


@dataclass(frozen=True, slots=True)
class Retrying:
    attempt: int
    max_attempts: int
    error: str


@dataclass(frozen=True, slots=True)
class Compacting:
    reason: str


@dataclass(frozen=True, slots=True)
class Compacted:
    reason: str
    ok: bool
    aborted: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class Notice:
    """An extension's ``ctx.ui.notify``."""

    level: str
    message: str


@dataclass(frozen=True, slots=True)
class StrayOutput:
    """pi wrote a line to stdout that is not protocol."""

    line: str
    problem: str


@dataclass(frozen=True, slots=True)
class RowsMirrored:
    """Rows the mirror made visible in the ledger, with when pi created each entry."""

    seqs: tuple[int, ...]
    entry_ids: tuple[str, ...]
    written_at: float
    """Wall-clock seconds (time.time()) right after the fenced write committed."""
    entry_times: tuple[float, ...]
    """Each entry's own timestamp (wall-clock seconds, from pi)."""


@dataclass(frozen=True, slots=True)
class StopRequested:
    reason: str
    hard: bool


@dataclass(frozen=True, slots=True)
class Settled:
    aborted: bool


@dataclass(frozen=True, slots=True)
class RunEnded:
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
