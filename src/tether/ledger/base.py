"""What every domain module of the SQL ledger stands on: the engine's part (connections,
transactions, error classes), and the checks that several domains make inside their own write
transactions (a session takes prompts, a fence still holds, a note's insert).

SQLite and PostgreSQL differ in connections, DDL and error classes; the statements of the domain
modules are portable (``?`` placeholders, which the PostgreSQL backend rewrites to ``%s``).
Every step write is fenced in the same transaction as the write itself:

    UPDATE runs SET … WHERE id = ? AND epoch = ? AND status = 'running'

changes one row or none. None means a newer owner claimed the run (``FencedOut``) or the run
ended (``RunNotActive``), and nothing is written. On PostgreSQL the UPDATE takes the run's row
lock, so a concurrent claim waits for the write to commit (or the write sees the new epoch and
changes nothing): no stale write can slip in between the check and the write.
"""

from __future__ import annotations

import abc
import contextlib
import enum
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from tether.errors import FencedOut, NotFound, RunNotActive, SessionRefusing
from tether.ledger.codec import INSERT_ROW, Cursor
from tether.ledger.models import Fence, Note
from tether.sizes import canonical_json

__all__ = ["Engine", "SqlBase"]


class Engine(enum.Enum):
    """The SQL engines a ledger runs on: where their SQL differs (DDL, full-text search), the
    code asks which one it speaks."""

    SQLITE = "sqlite"
    POSTGRES = "postgresql"


class SqlBase(abc.ABC):
    """The run ledger's common part. Open a ledger with :func:`tether.ledger.open_ledger`."""

    engine: Engine
    url: str
    path: Path | None = None
    """The ledger's file, when it is one (an agent's workdir must not contain it)."""
    _compactions_hint = ""
    """Table hint for reads of the newest compaction (the dialect may pin the partial index)."""
    _insert_row = INSERT_ROW
    """The statement that inserts one row from :func:`~tether.ledger.codec.encode_row`'s tuple
    (the dialect may derive more columns from it)."""

    # -- the dialect's part ------------------------------------------------------------------

    @abc.abstractmethod
    def _tx(self) -> contextlib.AbstractContextManager[Cursor]:
        """A cursor inside one write transaction (committed on exit, rolled back on error)."""

    @abc.abstractmethod
    def _read(self) -> contextlib.AbstractContextManager[Cursor]:
        """A cursor for reads."""

    @abc.abstractmethod
    def _is_unique_violation(self, exc: BaseException) -> bool: ...

    def _insert_rows(self, c: Cursor, encoded: Sequence[tuple[Any, ...]]) -> None:
        """Insert rows from :func:`~tether.ledger.codec.encode_row`'s tuples, in the current
        transaction (every writer of rows comes through here: appends, imports, copies)."""
        c.executemany(self._insert_row, encoded)

    @abc.abstractmethod
    def close(self) -> None: ...

    def _lock_session(self, c: Cursor, session_id: str, *, wait: bool = True) -> bool:
        """Serialize custody changes on a session inside the current write transaction; False
        when ``wait`` is off and another transaction holds it. SQLite's ``BEGIN IMMEDIATE``
        already serializes every write transaction, so there is nothing more to take."""
        return True

    def _lock_actor(self, c: Cursor, actor: str) -> None:
        """Serialize the admission of one actor's requests (its limits' counts and the insert,
        :mod:`tether.ledger.limits`) inside the current write transaction. SQLite's
        ``BEGIN IMMEDIATE`` already serializes every write transaction."""
        return

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checks inside a write transaction ---------------------------------------------------

    @staticmethod
    def _check_takes_prompts(c: Cursor, session_id: str) -> None:
        """Inside a write transaction: the session exists and does not refuse prompts."""
        c.execute("SELECT refusing FROM sessions WHERE id = ?", (session_id,))
        s = c.fetchone()
        if s is None:
            raise NotFound(f"no session {session_id!r}")
        if s[0]:
            raise SessionRefusing(
                f"session {session_id!r} refuses new prompts: {s[0]}; "
                f"after checking it, clear it with `tether session clear {session_id}`"
            )

    def _check_fence(
        self,
        c: Cursor,
        fence: Fence,
        assignments: str = "epoch = epoch",
        params: Sequence[Any] = (),
    ) -> None:
        c.execute(
            f"UPDATE runs SET {assignments} WHERE id = ? AND epoch = ? AND status = 'running'",
            (*params, fence.run, fence.epoch),
        )
        if c.rowcount == 1:
            return
        c.execute("SELECT status, epoch FROM runs WHERE id = ?", (fence.run,))
        r = c.fetchone()
        if r is None:
            raise NotFound(f"no run {fence.run!r}")
        if int(r[1]) != fence.epoch:
            raise FencedOut(
                f"run {fence.run!r} was claimed by a newer owner (epoch {r[1]} > {fence.epoch}); "
                "this writer must stop"
            )
        raise RunNotActive(f"run {fence.run!r} is {r[0]}; it takes no more writes")

    def _insert_note(self, c: Cursor, n: Note) -> None:
        c.execute(
            "INSERT INTO notes (session, agent, text, at, bytes, extra, actor, run, sources) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                n.session,
                n.agent,
                n.text,
                n.at,
                len(n.text.encode("utf-8")),
                canonical_json(n.extra) if n.extra else "{}",
                n.actor,
                n.run,
                canonical_json(list(n.sources)) if n.sources else "[]",
            ),
        )
