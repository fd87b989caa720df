"""The ledger by role: what a caller needs of it, as small protocols it can be given a fake of.

A caller names the narrowest role that covers what it does (the follow-up builder
:class:`ViewReads`, recall :class:`Search` with :class:`SessionReads`, the mirror
:class:`RowWriter`, …); :class:`Ledger` is all of them, what :func:`tether.ledger.open_ledger`
returns. Every backend (:class:`~tether.ledger.sql.SqlLedger` on SQLite and PostgreSQL)
satisfies each role structurally: mypy checks that at the foot of this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tether.ledger.bridges import Bridges
from tether.ledger.erasing import StopRequest
from tether.ledger.lifecycle import ErasePlan, Erasure, Selector
from tether.ledger.limits import ActorLoad, RunLimits
from tether.ledger.models import (
    Fence,
    Lease,
    NewRow,
    Note,
    Row,
    RowSize,
    Run,
    RunStatus,
    SearchHit,
    Session,
    TailRead,
)
from tether.ledger.outbox import Outbox
from tether.ledger.usage import DayBudget, UsageRole

if TYPE_CHECKING:
    from tether.ledger.imports import CopiedSession, ForkLink, Importer, StoredNote, StoredRun
    from tether.ledger.sql import SqlLedger

__all__ = [
    "Bridges",
    "Custody",
    "Interchange",
    "Ledger",
    "Lifecycle",
    "NoteReads",
    "Notes",
    "Outbox",
    "RowReads",
    "RowWriter",
    "Rows",
    "Search",
    "SessionReads",
    "Sessions",
    "UsageRole",
    "ViewReads",
]


class SessionReads(Protocol):
    """Session records and their last seq."""

    def session(self, session_id: str) -> Session | None: ...
    def get_session(self, session_id: str) -> Session: ...
    def sessions(self, *, limit: int = ...) -> list[Session]: ...
    def session_overview(
        self, *, limit: int = ...
    ) -> list[tuple[Session, int, dict[RunStatus, int]]]: ...
    def last_seq(self, session_id: str) -> int: ...


class Sessions(SessionReads, Protocol):
    """Sessions, read and written."""

    def create_session(
        self, session_id: str, *, created: str | None = ..., extra: dict[str, Any] | None = ...
    ) -> Session: ...
    def ensure_session(self, session_id: str) -> Session: ...
    def set_refusing(self, session_id: str, reason: str | None) -> None: ...
    def clear_refusing(
        self, session_id: str, *, actor: str, pi_checked: bool = ...
    ) -> str | None: ...


class Custody(Protocol):
    """Runs, the queue of requests and custody: claims, leases, placements,
    take-overs and fenced ends."""

    def create_run(
        self,
        session_id: str,
        agent: str,
        *,
        run_id: str | None = ...,
        extra: dict[str, Any] | None = ...,
    ) -> Run: ...
    def run(self, run_id: str) -> Run | None: ...
    def get_run(self, run_id: str) -> Run: ...
    def runs(self, session_id: str, *, limit: int = ...) -> list[Run]: ...
    def last_ended_run(self, session_id: str, agent: str) -> Run | None: ...
    def ended_runs(self, session_id: str, agent: str, *, limit: int = ...) -> list[Run]: ...
    def run_counts(self) -> dict[RunStatus, int]: ...
    def update_queued_extra(self, run_id: str, extra: dict[str, Any]) -> bool: ...
    def end_queued_run(
        self, run_id: str, status: RunStatus, *, extra: dict[str, Any] | None = ...
    ) -> Run | None: ...
    def claim_run(self, run_id: str) -> Fence: ...
    def enqueue_run(
        self,
        session_id: str,
        agent: str,
        *,
        actor: str,
        text: str,
        request_id: str | None = ...,
        run_id: str | None = ...,
        waiter: dict[str, Any] | None = ...,
        extra: dict[str, Any] | None = ...,
        limits: RunLimits | None = ...,
        budget: DayBudget | None = ...,
    ) -> tuple[Run, bool]: ...
    def actor_load(self, actor: str, *, now: float | None = ...) -> ActorLoad: ...
    def claim_next(
        self,
        *,
        owner: str,
        lease_s: float,
        session: str | None = ...,
        run_id: str | None = ...,
        live_limit: Callable[[str], int] | None = ...,
    ) -> Fence | None: ...
    def heartbeat(
        self, fence: Fence, *, lease_s: float, placement: dict[str, Any] | None = ...
    ) -> None: ...
    def lease(self, run_id: str) -> Lease | None: ...
    def last_placement(self, session_id: str) -> tuple[str, dict[str, Any]] | None: ...
    def live_runs(self, *, session: str | None = ...) -> list[Run]: ...
    def session_free(self, session_id: str) -> bool: ...
    def waited_heads(
        self, *, session: str | None = ..., limit: int = ...
    ) -> list[tuple[Run, dict[str, Any]]]: ...
    def queued_runs(self, session_id: str, *, limit: int = ...) -> list[Run]: ...
    def expired_leases(
        self, *, now: float | None = ..., session: str | None = ...
    ) -> list[Run]: ...
    def take_over(
        self,
        run_id: str,
        *,
        epoch: int,
        owner: str,
        lease_s: float,
        placement: dict[str, Any] | None = ...,
    ) -> Fence | None: ...
    def cancel_queued(self, run_id: str) -> bool: ...
    def end_run(
        self, fence: Fence, status: RunStatus, *, extra: dict[str, Any] | None = ...
    ) -> Run: ...
    def update_run_extra(self, fence: Fence, extra: dict[str, Any]) -> None: ...
    def stop_request(self, fence: Fence) -> StopRequest | None: ...


class RowReads(Protocol):
    """Bounded reads of rows, and every row of a session for a dump."""

    def row(self, session_id: str, seq: int) -> Row | None: ...
    def latest_compaction(self, session_id: str) -> Row | None: ...
    def run_first_seq(self, run_id: str) -> int | None: ...
    def run_rows_before(self, run_id: str, before: int, *, limit: int = ...) -> list[Row]: ...
    def rows_range(
        self, session_id: str, first: int, last: int, *, limit: int = ...
    ) -> list[Row]: ...
    def row_sizes(
        self, session_id: str, first: int, last: int, *, limit: int = ...
    ) -> list[RowSize]: ...
    def tail(
        self, session_id: str, max_bytes: int, *, after: int = ..., max_rows: int = ...
    ) -> TailRead: ...
    def iter_rows(self, session_id: str, *, page: int = ...) -> Iterator[Row]: ...


class RowWriter(Protocol):
    """Fenced appends of rows, and the session's last seq (what the mirror needs)."""

    def append(self, fence: Fence, rows: Sequence[NewRow], *, request: bool = ...) -> list[Row]: ...
    def last_seq(self, session_id: str) -> int: ...


class Rows(RowReads, RowWriter, Protocol):
    """Rows, read and appended."""


class NoteReads(Protocol):
    """An agent's notes on a session."""

    def notes(
        self, session_id: str, agent: str, *, max_count: int = ..., max_bytes: int = ...
    ) -> list[Note]: ...
    def all_notes(self, session_id: str) -> list[Note]: ...


class Notes(NoteReads, Protocol):
    """Notes, read and added."""

    def add_note(
        self,
        session_id: str,
        agent: str,
        text: str,
        *,
        at: str | None = ...,
        actor: str | None = ...,
        run: str | None = ...,
        sources: Sequence[str] = ...,
    ) -> Note: ...


class Search(Protocol):
    """Full-text search over one session's rows."""

    def search(
        self,
        session_id: str,
        words: Sequence[str],
        *,
        first: int = ...,
        last: int = ...,
        limit: int = ...,
        offset: int = ...,
        snippet_chars: int = ...,
    ) -> list[SearchHit]: ...


class Interchange(Protocol):
    """Records written as they are, in one transaction (``ledger load`` and ``ledger copy``),
    and the stored records ``ledger copy`` reads (a fork's link, runs and notes in their global
    orders)."""

    def importer(self) -> contextlib.AbstractContextManager[Importer]: ...
    def import_records(
        self,
        sessions: Sequence[Session],
        runs: Sequence[Run],
        rows: Iterable[Row],
        notes: Sequence[Note],
    ) -> None: ...
    def fork_link(self, session_id: str) -> ForkLink | None: ...
    def stored_runs(self, session_id: str, *, max_ord: int | None = ...) -> list[StoredRun]: ...
    def stored_notes(self, session_id: str, *, max_note: int | None = ...) -> list[StoredNote]: ...
    def copy_in(
        self,
        sessions: Sequence[CopiedSession],
        runs: Sequence[StoredRun],
        rows: Iterable[Row],
        notes: Sequence[StoredNote],
        *,
        erasures: Sequence[Erasure] = ...,
        adopt: Sequence[str] = ...,
    ) -> None: ...


class Lifecycle(Protocol):
    """Forks, erasure and its receipts, and the sessions retention erases."""

    def fork_session(
        self, session_id: str, at_run: str, new_id: str, *, created: str | None = ...
    ) -> Session: ...
    def fork_of(self, session_id: str) -> tuple[str, int] | None: ...

    def plan_erasure(self, selector: Selector) -> ErasePlan: ...
    def erase(
        self, selector: Selector, *, actor: str, at: str | None = ...
    ) -> tuple[Erasure, ErasePlan]: ...
    def erasures(self, *, limit: int = ...) -> list[Erasure]: ...
    def idle_sessions(self, before: str, *, limit: int = ...) -> list[str]: ...
    def begin_erasure(
        self, sessions: Sequence[str], *, actor: str, idle_before: str | None = ...
    ) -> list[str]: ...
    def end_erasure(self, sessions: Sequence[str]) -> None: ...
    def request_stop(self, run_id: str, *, hard: bool, detail: str, actor: str) -> bool: ...
    def live_runs(self, *, session: str | None = ...) -> list[Run]: ...
    def run(self, run_id: str) -> Run | None: ...


class ViewReads(Protocol):
    """The bounded reads the follow-up view is built from (each read is bounded): one session
    record, one latest compaction (by index), one or a few run records, one exact row, a byte-
    and row-capped tail, a row-capped range and count- and byte-capped notes."""

    def session(self, session_id: str) -> Session | None:
        """The session record."""
        ...

    def latest_compaction(self, session_id: str) -> Row | None:
        """The newest compaction row, wherever it lies (an index read)."""
        ...

    def last_ended_run(self, session_id: str, agent: str) -> Run | None:
        """The newest finished, failed or interrupted run of the agent."""
        ...

    def ended_runs(self, session_id: str, agent: str, *, limit: int = ...) -> list[Run]:
        """The newest ended runs of the agent, newest first, at most ``limit``."""
        ...

    def run_first_seq(self, run_id: str) -> int | None:
        """The seq of the first row the run wrote; None when it wrote none (an index read)."""
        ...

    def row(self, session_id: str, seq: int) -> Row | None:
        """One exact row."""
        ...

    def rows_range(self, session_id: str, first: int, last: int, *, limit: int = ...) -> list[Row]:
        """Rows ``first..last`` ascending, at most ``limit``."""
        ...

    def tail(
        self, session_id: str, max_bytes: int, *, after: int = ..., max_rows: int = ...
    ) -> TailRead:
        """The newest contiguous rows after ``after`` whose stored sizes fit ``max_bytes``."""
        ...

    def notes(
        self, session_id: str, agent: str, *, max_count: int = ..., max_bytes: int = ...
    ) -> list[Note]:
        """The newest notes of the agent that fit both bounds, oldest first."""
        ...


class Ledger(
    Sessions,
    Custody,
    Rows,
    Notes,
    Search,
    Interchange,
    Lifecycle,
    Outbox,
    UsageRole,
    Bridges,  # chat bridges (docs/bridges.md)
    Protocol,
):
    """The whole ledger: every role, and the ledger's own handle (its URL, its file, closing
    it). Open one with :func:`tether.ledger.open_ledger`."""

    url: str

    @property
    def path(self) -> Path | None:
        """The ledger's file, when it is one (an agent's workdir must not contain it)."""
        ...

    def close(self) -> None: ...
    def __enter__(self) -> Ledger: ...
    def __exit__(self, *exc: object) -> None: ...


if TYPE_CHECKING:

    def _every_backend_is_a_ledger(ledger: SqlLedger) -> tuple[Ledger, ViewReads]:
        """mypy proves here that every backend satisfies every role."""
        return ledger, ledger
