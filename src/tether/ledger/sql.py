"""The ledger's operations, written once over a DB-API connection.

SQLite and PostgreSQL differ in connections, DDL and error classes; the statements here are
portable (``?`` placeholders, which the PostgreSQL backend rewrites to ``%s``). Every step write
is fenced in the same transaction as the write itself:

    UPDATE runs SET … WHERE id = ? AND epoch = ? AND status = 'running'

changes one row or none. None means a newer owner claimed the run (``FencedOut``) or the run
ended (``RunNotActive``), and nothing is written. On PostgreSQL the UPDATE takes the run's row
lock, so a concurrent claim waits for the write to commit (or the write sees the new epoch and
changes nothing): no stale write can slip in between the check and the write.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from tether.errors import (
    AlreadyExists,
    FencedOut,
    NotFound,
    RunNotActive,
    SessionRefusing,
    StorageError,
)
from tether.ids import check_id, new_run_id
from tether.ledger.models import (
    ENDED_STATUSES,
    Fence,
    Lease,
    NewRow,
    Note,
    Row,
    RowKind,
    RowSize,
    Run,
    RunStatus,
    SearchHit,
    Session,
    TailRead,
    now_iso,
)
from tether.ledger.text import row_text
from tether.sizes import canonical_json, measure

__all__ = ["ROW_COLUMNS", "Cursor", "DuplicateEntry", "Importer", "SqlLedger"]

# Notes travel whole into every follow-up, so their reads are bounded by count and bytes.
DEFAULT_NOTES_COUNT = 32
DEFAULT_NOTES_BYTES = 16_000
# A tail read takes rows newest first in pages of this many.
TAIL_PAGE = 256
DEFAULT_TAIL_ROWS = 20_000
# Imported rows are written in batches of this many, or of this many bytes of bodies.
_IMPORT_CHUNK = 1000
_IMPORT_CHUNK_BYTES = 8 * 1024 * 1024

ROW_COLUMNS = (
    "session",
    "seq",
    "run",
    "actor",
    "kind",
    "body",
    "sources",
    "bytes",
    "media_bytes",
    "entry_id",
    "extra",
)
_ROW_COLS = ", ".join(ROW_COLUMNS)
_WORD = re.compile(r"\w+")
MAX_SEARCH_WORDS = 16
"""Words one search looks for: the cap is on the words searched, after splitting (a query of
one token can hold thousands of words, e.g. ``a.b.c…``)."""
_NOTE_COLS = "agent, text, at, extra, actor, run, sources"
_RUN_COLS = "id, session, agent, status, request_seq, started, ended, epoch, extra"
_ENDED = "(" + ", ".join(f"'{s.value}'" for s in sorted(ENDED_STATUSES)) + ")"


class Cursor(Protocol):
    """The part of a DB-API cursor the ledger uses (sqlite3 and psycopg both have it)."""

    @property
    def rowcount(self) -> int: ...
    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...
    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


def _loads(text: str | None) -> dict[str, Any]:
    if not text or text == "{}":
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StorageError(
            f"the ledger holds a corrupt record: an 'extra' field is not JSON ({exc}); "
            "restore the ledger from a backup"
        ) from exc
    if not isinstance(value, dict):
        raise StorageError("the ledger holds a corrupt record: an 'extra' field is not an object")
    return value


def _row(r: Sequence[Any]) -> Row:
    try:
        body = json.loads(r[5])
        sources = tuple(json.loads(r[6])) if r[6] != "[]" else ()
        kind = RowKind(r[4])
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
    except (ValueError, TypeError, RecursionError) as exc:
        # Rows are written only as canonical JSON: this one was changed outside tether.
        raise StorageError(
            f"row {r[1]} of session {r[0]!r} is corrupt ({exc}); it was changed outside "
            "tether: restore it from a backup or a `tether ledger dump`"
        ) from exc
    return Row(
        session=r[0],
        seq=r[1],
        run=r[2],
        actor=r[3],
        kind=kind,
        body=body,
        sources=sources,
        bytes=r[7],
        media_bytes=r[8],
        entry_id=r[9],
        extra=_loads(r[10]),
    )


def _row_size(session_id: str, seq: int, size: int, sources: str) -> RowSize:
    if sources == "[]":
        return RowSize(seq, size, ())
    try:
        return RowSize(seq, size, tuple(json.loads(sources)))
    except (ValueError, TypeError, RecursionError) as exc:
        raise StorageError(
            f"row {seq} of session {session_id!r} is corrupt ({exc}); it was changed outside "
            "tether: restore it from a backup or a `tether ledger dump`"
        ) from exc


def _note(session_id: str, r: Sequence[Any]) -> Note:
    return Note(
        session=session_id,
        agent=r[0],
        text=r[1],
        at=r[2],
        extra=_loads(r[3]),
        actor=r[4],
        run=r[5],
        sources=tuple(json.loads(r[6])) if r[6] != "[]" else (),
    )


def _run(r: Sequence[Any]) -> Run:
    return Run(
        id=r[0],
        session=r[1],
        agent=r[2],
        status=RunStatus(r[3]),
        request_seq=r[4],
        started=r[5],
        ended=r[6],
        epoch=r[7],
        extra=_loads(r[8]),
    )


def _lease(r: Sequence[Any]) -> Lease:
    return Lease(
        run=r[0],
        session=r[1],
        epoch=int(r[2]),
        owner=r[3],
        expires=float(r[4]) if r[4] is not None else None,
        placement=json.loads(r[5]) if r[5] else None,
    )


def encode_row(session: str, seq: int, run: str | None, row: NewRow) -> tuple[Any, ...]:
    """The stored tuple of a row: its body as canonical JSON, measured once, here."""
    body = canonical_json(row.body)
    m = measure(row.body, canonical=body)
    return (
        session,
        seq,
        run,
        row.actor,
        row.kind.value,
        body,
        canonical_json(list(row.sources)) if row.sources else "[]",
        m.text_bytes,
        m.media_bytes,
        row.entry_id,
        canonical_json(row.extra) if row.extra else "{}",
        row_text(row.kind, row.body),
    )


_INSERT_ROW = (
    "INSERT INTO rows (session, seq, run, actor, kind, body, sources, bytes, media_bytes, "
    "entry_id, extra, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class SqlLedger(abc.ABC):
    """The run ledger. Open one with :func:`tether.ledger.open_ledger`."""

    url: str
    path: Path | None = None
    """The ledger's file, when it is one (an agent's workdir must not contain it)."""
    _compactions_hint = ""
    """Table hint for reads of the newest compaction (the dialect may pin the partial index)."""
    _insert_row = _INSERT_ROW
    """The statement that inserts one row from :func:`encode_row`'s tuple (the dialect may
    derive more columns from it)."""

    # -- the dialect's part ------------------------------------------------------------------

    @abc.abstractmethod
    def _tx(self) -> contextlib.AbstractContextManager[Cursor]:
        """A cursor inside one write transaction (committed on exit, rolled back on error)."""

    @abc.abstractmethod
    def _read(self) -> contextlib.AbstractContextManager[Cursor]:
        """A cursor for reads."""

    @abc.abstractmethod
    def _is_unique_violation(self, exc: BaseException) -> bool: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def _lock_session(self, c: Cursor, session_id: str, *, wait: bool = True) -> bool:
        """Serialize custody changes on a session inside the current write transaction; False
        when ``wait`` is off and another transaction holds it. SQLite's ``BEGIN IMMEDIATE``
        already serializes every write transaction, so there is nothing more to take."""
        return True

    def __enter__(self) -> SqlLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions ----------------------------------------------------------------------------

    def create_session(
        self, session_id: str, *, created: str | None = None, extra: dict[str, Any] | None = None
    ) -> Session:
        check_id("session", session_id)
        s = Session(id=session_id, created=created or now_iso(), extra=extra or {})
        try:
            with self._tx() as c:
                c.execute(
                    "INSERT INTO sessions (id, created, extra) VALUES (?, ?, ?)",
                    (s.id, s.created, canonical_json(s.extra)),
                )
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise AlreadyExists(f"session {session_id!r} already exists") from exc
            raise
        return s

    def ensure_session(self, session_id: str) -> Session:
        """The session, created on first use."""
        found = self.session(session_id)
        if found is not None:
            return found
        try:
            return self.create_session(session_id)
        except AlreadyExists:
            return self.get_session(session_id)

    def session(self, session_id: str) -> Session | None:
        with self._read() as c:
            c.execute(
                "SELECT id, created, refusing, extra FROM sessions WHERE id = ?", (session_id,)
            )
            r = c.fetchone()
        return Session(id=r[0], created=r[1], refusing=r[2], extra=_loads(r[3])) if r else None

    def get_session(self, session_id: str) -> Session:
        found = self.session(session_id)
        if found is None:
            raise NotFound(f"no session {session_id!r}; `tether sessions` lists them")
        return found

    def sessions(self, *, limit: int = 1000) -> list[Session]:
        with self._read() as c:
            c.execute(
                "SELECT id, created, refusing, extra FROM sessions ORDER BY created, id LIMIT ?",
                (limit,),
            )
            return [
                Session(id=r[0], created=r[1], refusing=r[2], extra=_loads(r[3]))
                for r in c.fetchall()
            ]

    def session_overview(
        self, *, limit: int = 200
    ) -> list[tuple[Session, int, dict[RunStatus, int]]]:
        """The newest sessions first, each with its last seq and its run counts by status (two
        bounded reads, whatever the number of rows; for the service's pages)."""
        with self._read() as c:
            c.execute(
                "SELECT id, created, refusing, extra, last_seq FROM sessions "
                "ORDER BY created DESC, id DESC LIMIT ?",
                (limit,),
            )
            found = c.fetchall()
            counts: dict[str, dict[RunStatus, int]] = {r[0]: {} for r in found}
            if found:
                marks = ", ".join("?" for _ in found)
                c.execute(
                    f"SELECT session, status, COUNT(*) FROM runs WHERE session IN ({marks}) "
                    "GROUP BY session, status",
                    [r[0] for r in found],
                )
                for session, status, n in c.fetchall():
                    counts[session][RunStatus(status)] = int(n)
        return [
            (
                Session(id=r[0], created=r[1], refusing=r[2], extra=_loads(r[3])),
                int(r[4] or 0),
                counts[r[0]],
            )
            for r in found
        ]

    def last_seq(self, session_id: str) -> int:
        with self._read() as c:
            c.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,))
            r = c.fetchone()
        if r is None:
            raise NotFound(f"no session {session_id!r}")
        return int(r[0])

    def set_refusing(self, session_id: str, reason: str | None) -> None:
        """Mark the session as refusing new prompts (or clear it with ``None``)."""
        with self._tx() as c:
            c.execute("UPDATE sessions SET refusing = ? WHERE id = ?", (reason, session_id))
            if c.rowcount != 1:
                raise NotFound(f"no session {session_id!r}")

    # -- runs --------------------------------------------------------------------------------

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

    def create_run(
        self,
        session_id: str,
        agent: str,
        *,
        run_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Run:
        """A queued run. Refused while the session is refusing prompts."""
        check_id("agent", agent)
        rid = check_id("run", run_id) if run_id is not None else new_run_id()
        try:
            with self._tx() as c:
                self._check_takes_prompts(c, session_id)
                c.execute(
                    "INSERT INTO runs (id, session, agent, status, epoch, extra) "
                    "VALUES (?, ?, ?, 'queued', 0, ?)",
                    (rid, session_id, agent, canonical_json(extra or {})),
                )
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise AlreadyExists(f"run {rid!r} already exists") from exc
            raise
        return Run(
            id=rid, session=session_id, agent=agent, status=RunStatus.QUEUED, extra=extra or {}
        )

    def run(self, run_id: str) -> Run | None:
        with self._read() as c:
            c.execute(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (run_id,))
            r = c.fetchone()
        return _run(r) if r else None

    def get_run(self, run_id: str) -> Run:
        found = self.run(run_id)
        if found is None:
            raise NotFound(f"no run {run_id!r}")
        return found

    def runs(self, session_id: str, *, limit: int = 100_000) -> list[Run]:
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE session = ? ORDER BY ord LIMIT ?",
                (session_id, limit),
            )
            return [_run(r) for r in c.fetchall()]

    def update_queued_extra(self, run_id: str, extra: dict[str, Any]) -> bool:
        """Merge fields into a run's record while it is still queued; False once it was
        claimed (or ended)."""
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ? AND status = 'queued'", (run_id,))
            r = c.fetchone()
            if r is None:
                return False
            c.execute(
                "UPDATE runs SET extra = ? WHERE id = ? AND status = 'queued'",
                (canonical_json({**_loads(r[0]), **extra}), run_id),
            )
            return bool(c.rowcount == 1)

    def end_queued_run(
        self, run_id: str, status: RunStatus, *, extra: dict[str, Any] | None = None
    ) -> Run | None:
        """End a run that is still queued, without running it (e.g. its request was delivered
        into the live run); None when it is no longer queued (someone claimed it)."""
        if status not in ENDED_STATUSES:
            raise ValueError(f"{status} is not an ending status")
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ? AND status = 'queued'", (run_id,))
            r = c.fetchone()
            if r is None:
                return None
            merged = {**_loads(r[0]), **(extra or {})}
            c.execute(
                "UPDATE runs SET status = ?, ended = ?, extra = ? "
                "WHERE id = ? AND status = 'queued'",
                (status.value, now_iso(), canonical_json(merged), run_id),
            )
            if c.rowcount != 1:
                return None
        return self.get_run(run_id)

    def run_counts(self) -> dict[RunStatus, int]:
        """How many runs there are in each status (for the service's metrics)."""
        with self._read() as c:
            c.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")
            found = {RunStatus(r[0]): int(r[1]) for r in c.fetchall()}
        return {status: found.get(status, 0) for status in RunStatus}

    def claim_run(self, run_id: str) -> Fence:
        """Take ownership of a queued or running run. Each claim bumps the owner epoch; writes
        under an older fence are rejected from then on."""
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET epoch = epoch + 1, status = 'running', "
                "started = COALESCE(started, ?) "
                "WHERE id = ? AND status IN ('queued', 'running') RETURNING session, epoch",
                (now_iso(), run_id),
            )
            r = c.fetchone()
        if r is None:
            found = self.run(run_id)
            if found is None:
                raise NotFound(f"no run {run_id!r}")
            raise RunNotActive(f"run {run_id!r} is {found.status.value}; it cannot be claimed")
        return Fence(run=run_id, session=r[0], epoch=int(r[1]))

    # -- custody (DESIGN §3.7) ------------------------------------------------------------------

    def enqueue_run(
        self,
        session_id: str,
        agent: str,
        *,
        actor: str,
        text: str,
        request_id: str | None = None,
        run_id: str | None = None,
        waiter: dict[str, Any] | None = None,
    ) -> tuple[Run, bool]:
        """A ``queued`` run carrying its request in ``extra["request"]`` (the request row is
        written when the run starts), the session created on first use. The same
        ``(session, request_id)`` again returns ``(that run, False)`` and writes nothing.
        Refused (``SessionRefusing``) while the session refuses prompts. ``waiter`` records the
        process that waits to run it itself (``tether run``), so a waiter that died can be
        withdrawn from the queue (:meth:`waited_heads`)."""
        check_id("agent", agent)
        check_id("actor", actor)
        rid = check_id("run", run_id) if run_id is not None else new_run_id()
        self.ensure_session(session_id)
        extra = {"request": {"text": text, "actor": actor, "request_id": request_id}}
        try:
            with self._tx() as c:
                self._check_takes_prompts(c, session_id)
                c.execute(
                    "INSERT INTO runs (id, session, agent, status, epoch, extra, request_id, "
                    "placement) VALUES (?, ?, ?, 'queued', 0, ?, ?, ?)",
                    (
                        rid,
                        session_id,
                        agent,
                        canonical_json(extra),
                        request_id,
                        canonical_json(waiter) if waiter else None,
                    ),
                )
        except Exception as exc:
            if not self._is_unique_violation(exc):
                raise
            if request_id is not None:
                with self._read() as c:
                    c.execute(
                        f"SELECT {_RUN_COLS} FROM runs WHERE session = ? AND request_id = ?",
                        (session_id, request_id),
                    )
                    r = c.fetchone()
                if r is not None:
                    return _run(r), False
            raise AlreadyExists(f"run {rid!r} already exists") from exc
        return (
            Run(id=rid, session=session_id, agent=agent, status=RunStatus.QUEUED, extra=extra),
            True,
        )

    def _claim_in(
        self, c: Cursor, session_id: str, run_id: str | None, owner: str, lease_s: float
    ) -> Fence | None:
        """Inside a transaction holding the session's custody lock: claim the session's
        oldest queued run (or ``run_id`` if it is the oldest) when no run of it is live. Without
        ``run_id``, a run a ``tether run`` waits for (its waiter is recorded) is not taken: it is
        that process's to run, with the pi it already started."""
        c.execute(
            "SELECT id FROM runs WHERE session = ? AND status = 'running' LIMIT 1", (session_id,)
        )
        if c.fetchone() is not None:
            return None
        c.execute(
            "SELECT id, placement FROM runs WHERE session = ? AND status = 'queued' "
            "ORDER BY ord LIMIT 1",
            (session_id,),
        )
        first = c.fetchone()
        if first is None or (run_id is not None and first[0] != run_id):
            return None
        if run_id is None and first[1]:
            return None
        c.execute(
            "UPDATE runs SET epoch = epoch + 1, status = 'running', started = ?, owner = ?, "
            "lease_expires = ? WHERE id = ? AND status = 'queued' RETURNING epoch",
            (now_iso(), owner, time.time() + lease_s, first[0]),
        )
        r = c.fetchone()
        return Fence(run=first[0], session=session_id, epoch=int(r[0])) if r else None

    def claim_next(
        self,
        *,
        owner: str,
        lease_s: float,
        session: str | None = None,
        run_id: str | None = None,
    ) -> Fence | None:
        """Atomically take the oldest queued run (FIFO by creation) of a session that has no
        live run: it becomes ``running`` with a new epoch and a lease held by ``owner``. With
        ``run_id``, that run only, and only when it is first in its session's queue and the
        session is free. None when there is nothing to take."""
        if run_id is not None:
            found = self.run(run_id)
            if found is None:
                raise NotFound(f"no run {run_id!r}")
            if found.status is not RunStatus.QUEUED:
                raise RunNotActive(f"run {run_id!r} is {found.status.value}, not queued")
            session = found.session
        if session is not None:
            with self._tx() as c:
                self._lock_session(c, session)
                return self._claim_in(c, session, run_id, owner, lease_s)
        with self._read() as c:
            # Candidates: the head of each free session's queue, oldest first.
            c.execute(
                "SELECT q.session FROM runs q WHERE q.status = 'queued' AND NOT EXISTS "
                "(SELECT 1 FROM runs l WHERE l.session = q.session AND l.status = 'running') "
                "GROUP BY q.session ORDER BY MIN(q.ord) LIMIT 64"
            )
            candidates = [r[0] for r in c.fetchall()]
        for sid in candidates:
            with self._tx() as c:
                # Another worker holding this session's lock is claiming it: skip, as
                # FOR UPDATE SKIP LOCKED would.
                if not self._lock_session(c, sid, wait=False):
                    continue
                fence = self._claim_in(c, sid, None, owner, lease_s)
            if fence is not None:
                return fence
        return None

    def heartbeat(
        self, fence: Fence, *, lease_s: float, placement: dict[str, Any] | None = None
    ) -> None:
        """Extend the lease by ``lease_s`` from now and record the placement (fenced: raises
        ``FencedOut`` when a newer owner holds the run, ``RunNotActive`` when it ended)."""
        with self._tx() as c:
            if placement is None:
                self._check_fence(c, fence, "lease_expires = ?", (time.time() + lease_s,))
            else:
                self._check_fence(
                    c,
                    fence,
                    "lease_expires = ?, placement = ?",
                    (time.time() + lease_s, canonical_json(placement)),
                )

    def lease(self, run_id: str) -> Lease | None:
        """The custody record of a running run (None when the run is not running)."""
        with self._read() as c:
            c.execute(
                "SELECT id, session, epoch, owner, lease_expires, placement FROM runs "
                "WHERE id = ? AND status = 'running'",
                (run_id,),
            )
            r = c.fetchone()
        return _lease(r) if r else None

    def live_runs(self, *, session: str | None = None) -> list[Run]:
        """Running runs (of one session, or all), oldest first."""
        where, params = ("AND session = ?", (session,)) if session is not None else ("", ())
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE status = 'running' {where} ORDER BY ord",
                params,
            )
            return [_run(r) for r in c.fetchall()]

    def session_free(self, session_id: str) -> bool:
        """No run of the session is live or queued: a request now would run at once (so its
        pi is worth starting ahead; one that will wait holds no idle pi meanwhile)."""
        with self._read() as c:
            c.execute(
                "SELECT 1 FROM runs WHERE session = ? AND status IN ('running', 'queued') LIMIT 1",
                (session_id,),
            )
            return c.fetchone() is None

    def waited_heads(
        self, *, session: str | None = None, limit: int = 64
    ) -> list[tuple[Run, dict[str, Any]]]:
        """The first queued run of each session (or of ``session``) that has no live run, where
        a ``tether run`` waits for it, with that waiter (its placement): the runs workers pass
        by."""
        where, params = ("AND q.session = ? ", (session,)) if session is not None else ("", ())
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_COLS}, placement FROM runs q WHERE q.status = 'queued' "
                "AND q.placement IS NOT NULL AND q.ord = (SELECT MIN(h.ord) FROM runs h "
                "WHERE h.session = q.session AND h.status = 'queued') AND NOT EXISTS "
                "(SELECT 1 FROM runs l WHERE l.session = q.session AND l.status = 'running') "
                f"{where}ORDER BY q.ord LIMIT ?",
                (*params, limit),
            )
            return [(_run(r[:-1]), json.loads(r[-1])) for r in c.fetchall()]

    def queued_runs(self, session_id: str, *, limit: int = 1000) -> list[Run]:
        """A session's queued runs, in the order they will run."""
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE session = ? AND status = 'queued' "
                "ORDER BY ord LIMIT ?",
                (session_id, limit),
            )
            return [_run(r) for r in c.fetchall()]

    def expired_leases(self, *, now: float | None = None, session: str | None = None) -> list[Run]:
        """Live runs (of ``session``, or all) whose lease has expired, or was never taken (a
        run claimed with ``claim_run`` holds no lease and counts as expired)."""
        now = time.time() if now is None else now
        where, params = ("AND session = ?", (session,)) if session is not None else ("", ())
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE status = 'running' {where} "
                "AND (lease_expires IS NULL OR lease_expires <= ?) ORDER BY ord",
                (*params, now),
            )
            return [_run(r) for r in c.fetchall()]

    def take_over(
        self,
        run_id: str,
        *,
        epoch: int,
        owner: str,
        lease_s: float,
        placement: dict[str, Any] | None = None,
    ) -> Fence | None:
        """Claim a running run whose custody is being reconciled, only if its epoch is still
        ``epoch`` (compare and swap: of several reconcilers exactly one wins). The new owner
        holds a fresh lease and, when given, its ``placement`` replaces the old one (so no
        other reconciler takes the new owner for the lost one)."""
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET epoch = epoch + 1, owner = ?, lease_expires = ?, "
                "placement = COALESCE(?, placement) "
                "WHERE id = ? AND epoch = ? AND status = 'running' RETURNING session, epoch",
                (
                    owner,
                    time.time() + lease_s,
                    canonical_json(placement) if placement is not None else None,
                    run_id,
                    epoch,
                ),
            )
            r = c.fetchone()
        return Fence(run=run_id, session=r[0], epoch=int(r[1])) if r else None

    def cancel_queued(self, run_id: str) -> bool:
        """Withdraw a run that never started (it wrote nothing): True when it was removed."""
        with self._tx() as c:
            c.execute("DELETE FROM runs WHERE id = ? AND status = 'queued'", (run_id,))
            return c.rowcount == 1

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

    def append(self, fence: Fence, rows: Sequence[NewRow], *, request: bool = False) -> list[Row]:
        """Append rows under a fence, in one transaction: all or nothing.

        Rows that carry a pi ``entry_id`` already in the session are not appended again (the
        stored row is returned in their place), so a mirror that restarts never duplicates.
        With ``request=True`` the single row is recorded as the run's request."""
        if request and len(rows) != 1:
            raise ValueError("a run has exactly one request row")
        if not rows:
            return []
        for new in rows:
            check_id("actor", new.actor)
        with self._tx() as c:
            self._check_fence(c, fence)
            if request:
                # A run has one request row: a second request append is a retry whose first
                # attempt committed (its acknowledgement lost with the connection).
                c.execute(
                    f"SELECT {_ROW_COLS} FROM rows WHERE session = ? AND seq = "
                    "(SELECT request_seq FROM runs WHERE id = ?)",
                    (fence.session, fence.run),
                )
                found = c.fetchone()
                if found is not None:
                    return [_row(found)]
            existing: dict[str, Row] = {}
            ids = [r.entry_id for r in rows if r.entry_id is not None]
            if ids:
                marks = ", ".join("?" for _ in ids)
                c.execute(
                    f"SELECT {_ROW_COLS} FROM rows WHERE session = ? AND entry_id IN ({marks})",
                    (fence.session, *ids),
                )
                existing = {row.entry_id: row for row in map(_row, c.fetchall()) if row.entry_id}
            fresh = [r for r in rows if r.entry_id is None or r.entry_id not in existing]
            encoded: list[tuple[Any, ...]] = []
            if fresh:
                c.execute(
                    "UPDATE sessions SET last_seq = last_seq + ? WHERE id = ? RETURNING last_seq",
                    (len(fresh), fence.session),
                )
                last = int(c.fetchone()[0])
                first = last - len(fresh) + 1
                fresh = self._with_covered_sources(c, fence.session, first, fresh)
                encoded = [
                    encode_row(fence.session, first + i, fence.run, r) for i, r in enumerate(fresh)
                ]
                c.executemany(self._insert_row, encoded)
                if request:
                    c.execute("UPDATE runs SET request_seq = ? WHERE id = ?", (first, fence.run))
        out: list[Row] = []
        made = iter(zip(encoded, fresh, strict=True))
        for r in rows:
            if r.entry_id is not None and r.entry_id in existing:
                out.append(existing[r.entry_id])
            else:
                e, written = next(made)
                out.append(
                    Row(
                        session=e[0],
                        seq=e[1],
                        run=e[2],
                        actor=r.actor,
                        kind=r.kind,
                        body=r.body,
                        sources=tuple(written.sources),
                        bytes=e[7],
                        media_bytes=e[8],
                        entry_id=r.entry_id,
                        extra=r.extra,
                    )
                )
        return out

    def _with_covered_sources(
        self, c: Cursor, session_id: str, first: int, fresh: Sequence[NewRow]
    ) -> list[NewRow]:
        """Give each compaction row the union of the sources of the rows it covers (DESIGN
        invariant 18), at write time, so a follow-up that reads the checkpoint by index never
        has to read what it covers. The newest earlier compaction already holds the union below
        its own coverage, so only the rows after that coverage are read."""
        out: list[NewRow] = []
        for new in fresh:
            covers = new.body.get("covers_to") if new.kind is RowKind.COMPACTION else None
            if not isinstance(covers, int) or isinstance(covers, bool) or covers < 1:
                out.append(new)
                continue
            union: set[str] = set()
            stored_to = min(covers, first - 1)
            if stored_to >= 1:
                start = 1
                c.execute(
                    f"SELECT seq, body FROM rows {self._compactions_hint} "
                    "WHERE session = ? AND kind = 'compaction' "
                    "AND seq <= ? ORDER BY seq DESC LIMIT 1",
                    (session_id, stored_to),
                )
                prev = c.fetchone()
                if prev is not None:
                    below = json.loads(prev[1]).get("covers_to")
                    if isinstance(below, int) and not isinstance(below, bool):
                        start = max(1, min(below, int(prev[0]) - 1) + 1)
                c.execute(
                    "SELECT DISTINCT sources FROM rows WHERE session = ? AND seq >= ? "
                    "AND seq <= ? AND sources <> '[]'",
                    (session_id, start, stored_to),
                )
                for (text,) in c.fetchall():
                    union.update(json.loads(text))
            for j, prior in enumerate(out):
                if first + j <= covers:
                    union.update(prior.sources)
            added = sorted(union - set(new.sources))
            out.append(dataclasses.replace(new, sources=(*new.sources, *added)) if added else new)
        return out

    def end_run(
        self, fence: Fence, status: RunStatus, *, extra: dict[str, Any] | None = None
    ) -> Run:
        """Finish, fail or interrupt a run (fenced). ``extra`` is merged into the run's record."""
        if status not in ENDED_STATUSES:
            raise ValueError(f"{status} is not an ending status")
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ?", (fence.run,))
            r = c.fetchone()
            merged = {**_loads(r[0] if r else None), **(extra or {})}
            self._check_fence(
                c,
                fence,
                "status = ?, ended = ?, extra = ?",
                (status.value, now_iso(), canonical_json(merged)),
            )
        return self.get_run(fence.run)

    def update_run_extra(self, fence: Fence, extra: dict[str, Any]) -> None:
        """Merge fields into a running run's record (fenced)."""
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ?", (fence.run,))
            r = c.fetchone()
            merged = {**_loads(r[0] if r else None), **extra}
            self._check_fence(c, fence, "extra = ?", (canonical_json(merged),))

    # -- notes -------------------------------------------------------------------------------

    def add_note(
        self,
        session_id: str,
        agent: str,
        text: str,
        *,
        at: str | None = None,
        actor: str | None = None,
        run: str | None = None,
        sources: Sequence[str] = (),
    ) -> Note:
        check_id("agent", agent)
        note = Note(
            session=session_id,
            agent=agent,
            text=text,
            at=at or now_iso(),
            actor=actor,
            run=run,
            sources=tuple(sorted(set(sources))),
        )
        with self._tx() as c:
            self._insert_note(c, note)
        return note

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

    def notes(
        self,
        session_id: str,
        agent: str,
        *,
        max_count: int = DEFAULT_NOTES_COUNT,
        max_bytes: int = DEFAULT_NOTES_BYTES,
    ) -> list[Note]:
        """The newest notes of an agent on a session that fit both bounds, oldest first."""
        with self._read() as c:
            c.execute(
                f"SELECT {_NOTE_COLS}, bytes FROM notes WHERE session = ? AND agent = ? "
                "ORDER BY id DESC LIMIT ?",
                (session_id, agent, max_count),
            )
            picked: list[Note] = []
            total = 0
            for r in c.fetchall():
                if total + r[-1] > max_bytes:
                    break
                total += r[-1]
                picked.append(_note(session_id, r))
        picked.reverse()
        return picked

    def all_notes(self, session_id: str) -> list[Note]:
        with self._read() as c:
            c.execute(
                f"SELECT {_NOTE_COLS} FROM notes WHERE session = ? ORDER BY id", (session_id,)
            )
            return [_note(session_id, r) for r in c.fetchall()]

    # -- full-text search (recall) ------------------------------------------------------------

    @abc.abstractmethod
    def _search_query(
        self,
        words: Sequence[str],
        session_id: str,
        seqs: tuple[int, int],
        limit: int,
        offset: int,
        snippet_chars: int,
    ) -> tuple[str, list[Any]]:
        """The dialect's ranked search over one session's rows with ``seqs[0] <= seq <=
        seqs[1]`` (the statement and its parameters): columns are :data:`_ROW_COLS` of
        ``rows`` and then a snippet, best ranked first."""

    def search(
        self,
        session_id: str,
        words: Sequence[str],
        *,
        first: int = 1,
        last: int = 2**62,
        limit: int = 8,
        offset: int = 0,
        snippet_chars: int = 400,
    ) -> list[SearchHit]:
        """Rows of a session whose text holds any of ``words`` (whole words, any case), best
        ranked first, each with a snippet around the match. Words are passed as values, never
        as query syntax; a word that is not made of letters, digits or ``_`` is split into
        those it contains, and the first :data:`MAX_SEARCH_WORDS` words are searched."""
        words = list(dict.fromkeys(m.lower() for w in words for m in _WORD.findall(w)))
        words = words[:MAX_SEARCH_WORDS]
        if not words:
            return []
        sql, params = self._search_query(
            words, session_id, (first, last), limit, offset, snippet_chars
        )
        with self._read() as c:
            c.execute(sql, params)
            return [SearchHit(_row(r), r[11] or "") for r in c.fetchall()]

    # -- bounded reads -----------------------------------------------------------------------

    def row(self, session_id: str, seq: int) -> Row | None:
        """One exact row, by seq."""
        with self._read() as c:
            c.execute(
                f"SELECT {_ROW_COLS} FROM rows WHERE session = ? AND seq = ?", (session_id, seq)
            )
            r = c.fetchone()
        return _row(r) if r else None

    def latest_compaction(self, session_id: str) -> Row | None:
        """The newest compaction row of the session, wherever it lies."""
        with self._read() as c:
            c.execute(
                f"SELECT {_ROW_COLS} FROM rows {self._compactions_hint} "
                "WHERE session = ? AND kind = 'compaction' "
                "ORDER BY seq DESC LIMIT 1",
                (session_id,),
            )
            r = c.fetchone()
        return _row(r) if r else None

    def last_ended_run(self, session_id: str, agent: str) -> Run | None:
        """The newest finished, failed or interrupted run of an agent on a session."""
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE session = ? AND agent = ? "
                f"AND status IN {_ENDED} ORDER BY ord DESC LIMIT 1",
                (session_id, agent),
            )
            r = c.fetchone()
        return _run(r) if r else None

    def ended_runs(self, session_id: str, agent: str, *, limit: int = 32) -> list[Run]:
        """The newest finished, failed or interrupted runs of an agent, newest first."""
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE session = ? AND agent = ? "
                f"AND status IN {_ENDED} ORDER BY ord DESC LIMIT ?",
                (session_id, agent, limit),
            )
            return [_run(r) for r in c.fetchall()]

    def run_first_seq(self, run_id: str) -> int | None:
        """The seq of the first row a run wrote, None when it wrote none (index rows_by_run)."""
        with self._read() as c:
            c.execute("SELECT seq FROM rows WHERE run = ? ORDER BY seq LIMIT 1", (run_id,))
            r = c.fetchone()
        return int(r[0]) if r else None

    def run_rows_before(self, run_id: str, before: int, *, limit: int = 50) -> list[Row]:
        """A run's rows with ``seq < before``, newest first, at most ``limit`` of them (index
        rows_by_run): the end of a run without reading it from its start."""
        with self._read() as c:
            c.execute(
                f"SELECT {_ROW_COLS} FROM rows WHERE run = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                (run_id, before, limit),
            )
            return [_row(r) for r in c.fetchall()]

    def rows_range(self, session_id: str, first: int, last: int, *, limit: int = 1000) -> list[Row]:
        """Rows with ``first <= seq <= last``, ascending, at most ``limit`` of them."""
        # Seqs are dense, so the first `limit` rows lie in [first, first + limit - 1]: bounding
        # the range keeps the read bounded whatever plan the database picks (PostgreSQL without
        # fresh statistics may fetch the whole range and sort it).
        last = min(last, first + limit - 1)
        with self._read() as c:
            c.execute(
                f"SELECT {_ROW_COLS} FROM rows WHERE session = ? AND seq >= ? AND seq <= ? "
                "ORDER BY seq LIMIT ?",
                (session_id, first, last, limit),
            )
            return [_row(r) for r in c.fetchall()]

    def row_sizes(
        self, session_id: str, first: int, last: int, *, limit: int = 1000
    ) -> list[RowSize]:
        """The stored sizes and sources of rows with ``first <= seq <= last``, ascending, at
        most ``limit`` of them: no bodies, so a reader can pick the rows whose bodies it needs
        before it reads them (:meth:`rows_range`)."""
        last = min(last, first + limit - 1)  # seqs are dense: see rows_range
        with self._read() as c:
            c.execute(
                "SELECT seq, bytes, sources FROM rows WHERE session = ? AND seq >= ? AND seq <= ? "
                "ORDER BY seq LIMIT ?",
                (session_id, first, last, limit),
            )
            return [_row_size(session_id, *r) for r in c.fetchall()]

    def tail(
        self,
        session_id: str,
        max_bytes: int,
        *,
        after: int = 0,
        max_rows: int = DEFAULT_TAIL_ROWS,
    ) -> TailRead:
        """The newest contiguous rows with ``seq > after`` whose stored sizes fit ``max_bytes``,
        read newest first in pages and returned oldest first. Stops at the first row that does
        not fit: a tail is contiguous."""
        taken: list[Row] = []
        total = 0
        with self._read() as c:
            c.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,))
            found = c.fetchone()
            # Seqs are dense, so each page is a window of TAIL_PAGE seqs below the newest: the
            # read stays bounded whatever plan the database picks for a range. Sizes come first,
            # from the (session, seq, bytes) index, and bodies only for the rows taken: a page
            # of huge rows past the budget is never read.
            top = int(found[0]) if found else after
            while top > after:
                low = max(after, top - TAIL_PAGE)
                c.execute(
                    "SELECT seq, bytes FROM rows WHERE session = ? AND seq > ? AND seq <= ? "
                    "ORDER BY seq DESC LIMIT ?",
                    (session_id, low, top, TAIL_PAGE),
                )
                stop: int | None = None
                first = top + 1
                for seq, size in c.fetchall():
                    if total + size > max_bytes or len(taken) + (top - seq) >= max_rows:
                        stop = seq
                        break
                    total += size
                    first = seq
                if first <= top:
                    c.execute(
                        f"SELECT {_ROW_COLS} FROM rows WHERE session = ? AND seq >= ? AND seq <= ? "
                        "ORDER BY seq DESC",
                        (session_id, first, top),
                    )
                    taken.extend(map(_row, c.fetchall()))
                if stop is not None:
                    taken.reverse()
                    return TailRead(rows=taken, bytes=total, stop_seq=stop)
                top = low
        taken.reverse()
        return TailRead(rows=taken, bytes=total, stop_seq=None)

    def iter_rows(self, session_id: str, *, page: int = 1000) -> Iterator[Row]:
        """Every row of a session, in seq order (for dumps and copies, not for follow-ups)."""
        after = 0
        while True:
            batch = self.rows_range(session_id, after + 1, 2**62, limit=page)
            yield from batch
            if len(batch) < page:
                return
            after = batch[-1].seq

    # -- interchange import --------------------------------------------------------------------

    @contextlib.contextmanager
    def importer(self) -> Iterator[Importer]:
        """One write transaction that takes records as they come (``ledger load`` streams a file
        through it): committed when the block ends, rolled back when it raises."""
        with self._tx() as c:
            imp = Importer(self, c)
            yield imp
            imp.finish()

    def import_records(
        self,
        sessions: Sequence[Session],
        runs: Sequence[Run],
        rows: Iterable[Row],
        notes: Sequence[Note],
    ) -> None:
        """Write already-validated interchange records in one transaction (``ledger load``).

        Runs are created in the order given. Row seqs are taken as given; the caller has checked
        that they continue each session densely."""
        with self._tx() as c:
            self._write_records(c, sessions, runs, rows, notes)

    def _write_records(
        self,
        c: Cursor,
        sessions: Sequence[Session],
        runs: Sequence[Run],
        rows: Iterable[Row],
        notes: Sequence[Note],
    ) -> None:
        """:meth:`import_records` inside the caller's transaction. Rows are consumed as they
        come, a chunk at a time, so ``ledger copy`` can stream a long session through it."""
        for s in sessions:
            try:
                c.execute(
                    "INSERT INTO sessions (id, created, refusing, extra) VALUES (?, ?, ?, ?)",
                    (s.id, s.created, s.refusing, canonical_json(s.extra)),
                )
            except Exception as exc:
                if self._is_unique_violation(exc):
                    raise AlreadyExists(f"session {s.id!r} already exists in the ledger") from exc
                raise
        for run in runs:
            try:
                c.execute(
                    "INSERT INTO runs (id, session, agent, status, request_seq, started, "
                    "ended, epoch, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run.id,
                        run.session,
                        run.agent,
                        run.status.value,
                        run.request_seq,
                        run.started,
                        run.ended,
                        run.epoch,
                        canonical_json(run.extra),
                    ),
                )
            except Exception as exc:
                if self._is_unique_violation(exc):
                    raise AlreadyExists(f"run {run.id!r} already exists in the ledger") from exc
                raise
        by_session: dict[str, int] = {}
        encoded: list[tuple[Any, ...]] = []
        for row in rows:
            new = NewRow(
                actor=row.actor,
                kind=row.kind,
                body=row.body,
                sources=row.sources,
                entry_id=row.entry_id,
                extra=row.extra,
            )
            encoded.append(encode_row(row.session, row.seq, row.run, new))
            by_session[row.session] = max(by_session.get(row.session, 0), row.seq)
            if len(encoded) >= _IMPORT_CHUNK:
                c.executemany(self._insert_row, encoded)
                encoded = []
        if encoded:
            c.executemany(self._insert_row, encoded)
        for sid, last in by_session.items():
            c.execute("UPDATE sessions SET last_seq = ? WHERE id = ?", (last, sid))
        for n in notes:
            self._insert_note(c, n)


class DuplicateEntry(Exception):
    """An imported row repeats a pi entry id of its session (``line`` is the row's)."""

    def __init__(self, line: int, session: str, entry_id: str) -> None:
        super().__init__(f"entry {entry_id!r} appears twice in session {session!r}")
        self.line = line


class Importer:
    """Writes interchange records inside one transaction, rows in bounded batches, and answers
    the questions a loader asks about what the ledger (and this transaction) already holds."""

    def __init__(self, ledger: SqlLedger, cursor: Cursor) -> None:
        self._ledger = ledger
        self._c = cursor
        self._rows: list[tuple[Any, ...]] = []
        self._bytes = 0
        self._last: dict[str, int] = {}
        self._lines: list[int] = []

    def last_seq(self, session_id: str) -> int | None:
        """The session's last seq, None when the ledger has no such session."""
        if session_id in self._last:
            return self._last[session_id]
        self._c.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,))
        r = self._c.fetchone()
        return None if r is None else int(r[0])

    def run_session(self, run_id: str) -> str | None:
        """The session of a run the ledger holds, None when it holds no such run."""
        self._c.execute("SELECT session FROM runs WHERE id = ?", (run_id,))
        r = self._c.fetchone()
        return None if r is None else str(r[0])

    def session(self, s: Session) -> None:
        self._c.execute(
            "INSERT INTO sessions (id, created, refusing, extra) VALUES (?, ?, ?, ?)",
            (s.id, s.created, s.refusing, canonical_json(s.extra)),
        )
        self._last[s.id] = 0

    def run(self, run: Run) -> None:
        self._c.execute(
            "INSERT INTO runs (id, session, agent, status, request_seq, started, "
            "ended, epoch, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.id,
                run.session,
                run.agent,
                run.status.value,
                run.request_seq,
                run.started,
                run.ended,
                run.epoch,
                canonical_json(run.extra),
            ),
        )

    def row(self, row: Row, line: int = 0) -> None:
        """Queue a row (written a batch at a time); ``line`` names it in a DuplicateEntry."""
        new = NewRow(
            actor=row.actor,
            kind=row.kind,
            body=row.body,
            sources=row.sources,
            entry_id=row.entry_id,
            extra=row.extra,
        )
        encoded = encode_row(row.session, row.seq, row.run, new)
        self._rows.append(encoded)
        self._lines.append(line)
        self._bytes += len(encoded[5]) + len(encoded[11])
        self._last[row.session] = row.seq
        if len(self._rows) >= _IMPORT_CHUNK or self._bytes >= _IMPORT_CHUNK_BYTES:
            self._flush()

    def note(self, n: Note) -> None:
        self._ledger._insert_note(self._c, n)

    def _flush(self) -> None:
        if self._rows:
            self._check_entries()
            self._c.executemany(self._ledger._insert_row, self._rows)
            self._rows = []
            self._lines = []
            self._bytes = 0

    def _check_entries(self) -> None:
        """pi entry ids are unique in a session (appends are idempotent on them): a batch may
        repeat none, within itself or of the rows stored before it (one query per session)."""
        first: dict[tuple[str, str], int] = {}
        for encoded, line in zip(self._rows, self._lines, strict=True):
            sid, eid = encoded[0], encoded[9]
            if eid is None:
                continue
            if (sid, eid) in first:
                raise DuplicateEntry(line, sid, eid)
            first[(sid, eid)] = line
        by_session: dict[str, list[str]] = {}
        for sid, eid in first:
            by_session.setdefault(sid, []).append(eid)
        for sid, ids in by_session.items():
            marks = ", ".join("?" for _ in ids)
            self._c.execute(
                f"SELECT entry_id FROM rows WHERE session = ? AND entry_id IN ({marks}) LIMIT 1",
                (sid, *ids),
            )
            taken = self._c.fetchone()
            if taken is not None:
                raise DuplicateEntry(first[(sid, taken[0])], sid, taken[0])

    def finish(self) -> None:
        self._flush()
        for sid, last in self._last.items():
            if last:
                self._c.execute("UPDATE sessions SET last_seq = ? WHERE id = ?", (last, sid))
