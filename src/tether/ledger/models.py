"""The ledger's data model (docs/contracts.md#the-interchange-format): sessions, runs, rows, notes,
receipts, fences.

Records are frozen msgspec structs (``msgspec.structs.replace`` makes a changed copy; a class is
made in a few microseconds, where a frozen dataclass took a millisecond of every process's
start). Rows, which reads build by the thousand, are named tuples. ``extra`` keeps fields this
version does not know, so a JSONL round trip never loses them.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec

__all__ = [
    "ENDED_STATUSES",
    "Fence",
    "Lease",
    "NewRow",
    "Note",
    "ReceiptReason",
    "Row",
    "RowKind",
    "Run",
    "RunStatus",
    "SearchHit",
    "Session",
    "TailRead",
    "now_iso",
]


def now_iso() -> str:
    """UTC timestamp as the interchange format writes it: ``2026-11-29T10:00:00.123456Z``."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class RunStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


ENDED_STATUSES = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED})


class RowKind(enum.StrEnum):
    """A row holds exactly one of: a pi AgentMessage, a compaction, or a receipt."""

    MESSAGE = "message"
    COMPACTION = "compaction"
    RECEIPT = "receipt"


class ReceiptReason(enum.StrEnum):
    """Why a continuation checkpoint was refused (a closed set;
    docs/contracts.md#the-interchange-format)."""

    CANCELLED = "cancelled"
    TRUNCATED = "truncated"
    EMPTY = "empty"
    OVER_BOUND = "over_bound"
    PROVIDER_FAILURE = "provider_failure"


class Session(msgspec.Struct, frozen=True):
    id: str
    created: str
    refusing: str | None = None
    """Why the session refuses new prompts (set when pi's idle could not be confirmed)."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


class Run(msgspec.Struct, frozen=True):
    id: str
    session: str
    agent: str
    status: RunStatus
    request_seq: int | None = None
    started: str | None = None
    ended: str | None = None
    epoch: int = 0
    """The owner epoch: bumped by every claim; writes carrying an older one are fenced out."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


class Fence(msgspec.Struct, frozen=True):
    """Proof of ownership of a running run. Every step write carries it."""

    run: str
    session: str
    epoch: int


class Lease(msgspec.Struct, frozen=True):
    """A live run's custody (docs/architecture.md#custody): who holds it, until when, and where pi
    runs."""

    run: str
    session: str
    epoch: int
    owner: str | None
    expires: float | None
    """Wall-clock seconds (``time.time()``) after which the lease counts as expired."""
    placement: dict[str, Any] | None
    """``{"host", "harness_pid", "harness_start", "pi_pid", "pi_start", "keeper_pid",
    "keeper_start", "run_dir"}`` as the holder last recorded it; None before pi started. The
    start times are seconds since boot (:func:`tether.processes.start_time`): a clock step does
    not move them."""

    def expired(self, now: float) -> bool:
        return self.expires is None or self.expires <= now


class NewRow(msgspec.Struct, frozen=True):
    """A row to append; the ledger assigns ``seq`` and measures it."""

    actor: str
    kind: RowKind
    body: dict[str, Any]
    """The pi AgentMessage, the compaction object or the receipt object."""
    sources: tuple[str, ...] = ()
    entry_id: str | None = None
    """pi's session entry id, when the row mirrors one; appends are idempotent on it."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    @staticmethod
    def message(actor: str, message: dict[str, Any], **kw: Any) -> NewRow:
        return NewRow(actor=actor, kind=RowKind.MESSAGE, body=message, **kw)


class Row(NamedTuple):
    """A stored row. A named tuple, not a frozen dataclass: appends and reads build thousands of
    these, and a frozen dataclass costs about three times as much to construct."""

    session: str
    seq: int
    run: str | None
    actor: str
    kind: RowKind
    body: dict[str, Any]
    sources: tuple[str, ...]
    bytes: int
    """Measured once, at append (docs/contracts.md#byte-accounting): canonical JSON of the body,
    media as lengths."""
    media_bytes: int = 0
    entry_id: str | None = None
    extra: dict[str, Any] = {}  # noqa: RUF012  (a NamedTuple default is shared: never mutate it)

    @property
    def covers_to(self) -> int | None:
        """For a compaction row: the last seq it summarizes."""
        if self.kind is RowKind.COMPACTION:
            value = self.body.get("covers_to")
            return value if isinstance(value, int) else None
        return None

    @property
    def role(self) -> str | None:
        if self.kind is RowKind.MESSAGE:
            role = self.body.get("role")
            return role if isinstance(role, str) else None
        return None


class Note(msgspec.Struct, frozen=True):
    session: str
    agent: str
    text: str
    at: str
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    actor: str | None = None
    """The actor of the run that wrote it (the requester the agent worked for)."""
    run: str | None = None
    sources: tuple[str, ...] = ()
    """The run's obligations when it wrote the note: admission applies to a note like a row."""


class SearchHit(NamedTuple):
    """A row that a full-text search found, with a snippet of its text around the match."""

    row: Row
    snippet: str


class RowSize(NamedTuple):
    """What a reader needs to decide whether to read a row's body: its stored size (bytes, as
    measured at append) and its sources (whether the reader may see it)."""

    seq: int
    bytes: int
    sources: tuple[str, ...]


class TailRead(msgspec.Struct, frozen=True):
    """The newest contiguous rows (ascending) whose stored sizes fit a byte budget.

    ``stop_seq`` is the seq of the newest row that was not taken because it did not fit (or the
    row cap was reached), None when the tail reached the floor of the read. ``last_seq`` is the
    session's last seq the read began at (None when not known): seqs between ``stop_seq`` (or
    the floor) and it that are not among ``rows`` no longer exist (they were erased)."""

    rows: list[Row]
    bytes: int
    stop_seq: int | None
    last_seq: int | None = None
