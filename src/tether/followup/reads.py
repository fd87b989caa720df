"""The narrow, bounded read API the follow-up builder may use.

:class:`~tether.ledger.sql.SqlLedger` satisfies it structurally, on every backend. Each method
reads a bounded amount whatever the session's length (DESIGN invariant 9): one session record,
one latest compaction (by index), one or a few run records, one exact row, a byte- and
row-capped tail, a row-capped range and count- and byte-capped notes. Tests wrap it to count what
the builder reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tether.ledger.models import Note, Row, Run, Session, TailRead

if TYPE_CHECKING:
    from tether.ledger.sql import SqlLedger

__all__ = ["FollowupReads"]


class FollowupReads(Protocol):
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


if TYPE_CHECKING:

    def _ledger_reads(ledger: SqlLedger) -> FollowupReads:
        """mypy proves here that every ledger backend satisfies the protocol."""
        return ledger
