"""Interchange import: records written as they are (``ledger load`` streams a file through an
:class:`Importer`; ``ledger copy`` writes another ledger's sessions), in one transaction, rows in
bounded batches.

``ledger copy`` also reads a session as it is stored, not as its view: a fork's link to the
session it was forked from (:meth:`ImportSql.fork_link`), and the runs and notes stored under a
session with their places in the ledger's global orders (:meth:`ImportSql.stored_runs`,
:meth:`ImportSql.stored_notes`), which a fork's bounds refer to. :meth:`ImportSql.copy_in`
writes them with those bounds translated into the destination's orders."""

from __future__ import annotations

import bisect
import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from tether.errors import AlreadyExists
from tether.ledger import codec
from tether.ledger.base import SqlBase
from tether.ledger.codec import Cursor, encode_row
from tether.ledger.models import (
    NewRow,
    Note,
    Row,
    Run,
    Session,
)
from tether.sizes import canonical_json

if TYPE_CHECKING:
    from tether.ledger.lifecycle import Erasure

__all__ = [
    "CopiedSession",
    "DuplicateEntry",
    "ForkLink",
    "ImportSql",
    "Importer",
    "StoredNote",
    "StoredRun",
]

# Imported rows are written in batches of this many, or of this many bytes of bodies.
_IMPORT_CHUNK = 1000
_IMPORT_CHUNK_BYTES = 8 * 1024 * 1024


# Sessions and runs arrive whole: every field as the record gives it.
_INSERT_SESSION = "INSERT INTO sessions (id, created, refusing, extra) VALUES (?, ?, ?, ?)"
_INSERT_RUN = (
    "INSERT INTO runs (id, session, agent, status, request_seq, started, ended, epoch, extra) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _session_params(s: Session) -> tuple[Any, ...]:
    return (s.id, s.created, s.refusing, canonical_json(s.extra))


def _run_params(run: Run) -> tuple[Any, ...]:
    return (
        run.id,
        run.session,
        run.agent,
        run.status.value,
        run.request_seq,
        run.started,
        run.ended,
        run.epoch,
        canonical_json(run.extra),
    )


class ForkLink(NamedTuple):
    """A fork's link to the session it was forked from: the last seq it inherits, and the
    bounds on the ledger's global run order (``ord``) and note ids of what it inherits."""

    parent: str
    seq: int
    ord: int
    note: int


class StoredRun(NamedTuple):
    """A run as stored: its place in the ledger's global run order, its record, and its
    custody columns (:data:`RUN_CUSTODY`, as the ledger holds them)."""

    ord: int
    run: Run
    custody: tuple[Any, ...]

    def under(self, session_id: str) -> StoredRun:
        """The same run stored under another session (a copy that flattens a fork)."""
        if self.run.session == session_id:
            return self
        return self._replace(run=msgspec.structs.replace(self.run, session=session_id))


class StoredNote(NamedTuple):
    """A note as stored: its id (the ledger's global note order) and the note."""

    id: int
    note: Note


class CopiedSession(NamedTuple):
    """A session as ``ledger copy`` writes it: its record, its last seq (erased rows leave
    seqs unused), and, for a fork kept as one, its link with the source ledger's bounds."""

    session: Session
    last_seq: int
    fork: ForkLink | None = None


RUN_CUSTODY = ("lease_expires", "owner", "placement", "request_id", "actor", "created_epoch")
"""A run's columns besides its record (:data:`~tether.ledger.codec.RUN_COLS`): custody, the
idempotency key of its request and what the actor's limits count."""
_RUN_STORED = f"ord, {codec.RUN_COLS}, {', '.join(RUN_CUSTODY)}"
_COPY_RUN = (
    f"INSERT INTO runs ({codec.RUN_COLS}, {', '.join(RUN_CUSTODY)}) "
    f"VALUES ({', '.join('?' * (9 + len(RUN_CUSTODY)))}) RETURNING ord"
)
_COPY_NOTE = (
    "INSERT INTO notes (session, agent, text, at, bytes, extra, actor, run, sources) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id"
)


def _bound(pairs: Sequence[tuple[int, int]], bound: int) -> int:
    """A source bound on an order (``ord <= bound``) as the destination's: the destination
    number of the newest copied record within it (0: none is). ``pairs`` are (source,
    destination) numbers, both ascending: the copy keeps the order."""
    i = bisect.bisect_right(pairs, (bound, 2**63))
    return pairs[i - 1][1] if i else 0


class ImportSql(SqlBase):
    """Interchange import."""

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

    def fork_link(self, session_id: str) -> ForkLink | None:
        """The session's link to the one it was forked from; None when it is no fork (or
        there is no such session)."""
        with self._read() as c:
            c.execute(
                "SELECT parent, fork_seq, fork_ord, fork_note FROM sessions WHERE id = ?",
                (session_id,),
            )
            r = c.fetchone()
        if r is None or r[0] is None:
            return None
        return ForkLink(r[0], int(r[1]), int(r[2]), int(r[3]))

    def stored_runs(self, session_id: str, *, max_ord: int | None = None) -> list[StoredRun]:
        """The runs stored under the session (a fork's inherited ones are its parent's), in
        the ledger's run order, those with ``ord <= max_ord`` when it is given."""
        bound, params = ("", ()) if max_ord is None else (" AND ord <= ?", (max_ord,))
        with self._read() as c:
            c.execute(
                f"SELECT {_RUN_STORED} FROM runs WHERE session = ?{bound} ORDER BY ord",
                (session_id, *params),
            )
            return [
                StoredRun(int(r[0]), codec.run_of(r[1:10]), tuple(r[10:])) for r in c.fetchall()
            ]

    def stored_notes(self, session_id: str, *, max_note: int | None = None) -> list[StoredNote]:
        """The notes stored under the session, by id, those with ``id <= max_note`` when it
        is given."""
        bound, params = ("", ()) if max_note is None else (" AND id <= ?", (max_note,))
        with self._read() as c:
            c.execute(
                f"SELECT id, {codec.NOTE_COLS} FROM notes WHERE session = ?{bound} ORDER BY id",
                (session_id, *params),
            )
            return [StoredNote(int(r[0]), codec.note_of(session_id, r[1:])) for r in c.fetchall()]

    def copy_in(
        self,
        sessions: Sequence[CopiedSession],
        runs: Sequence[StoredRun],
        rows: Iterable[Row],
        notes: Sequence[StoredNote],
        *,
        erasures: Sequence[Erasure] = (),
        adopt: Sequence[str] = (),
    ) -> None:
        """Write another ledger's sessions as they are stored (``ledger copy``), in one
        transaction, rows consumed as they come. Runs and notes are written in their source
        order, so the order the ledger keeps of each (a fork's bounds) is the same here, and
        each fork's bounds are translated into this ledger's numbers. The sessions named in
        ``adopt`` (empty sessions of this ledger, say ones made by ``ensure_session``) are taken
        over by the copy. ``erasures`` are receipts to keep (one this ledger has already, the
        same time, actor and selector, is not written twice)."""
        with self._tx() as c:
            for sid in adopt:
                # Taken over only if it is still empty; otherwise the insert below is refused.
                c.execute(
                    "DELETE FROM sessions WHERE id = ? AND last_seq = 0 "
                    "AND NOT EXISTS (SELECT 1 FROM runs WHERE session = ?) "
                    "AND NOT EXISTS (SELECT 1 FROM notes WHERE session = ?)",
                    (sid, sid, sid),
                )
            for s in sessions:
                try:
                    c.execute(
                        "INSERT INTO sessions (id, created, refusing, extra, last_seq, parent, "
                        "fork_seq) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (
                            *_session_params(s.session),
                            s.last_seq,
                            s.fork.parent if s.fork else None,
                            s.fork.seq if s.fork else None,
                        ),
                    )
                except Exception as exc:
                    if self._is_unique_violation(exc):
                        raise AlreadyExists(
                            f"session {s.session.id!r} already exists in the ledger"
                        ) from exc
                    raise
            ords: list[tuple[int, int]] = []
            for stored in sorted(runs, key=lambda r: r.ord):
                try:
                    c.execute(_COPY_RUN, (*_run_params(stored.run), *stored.custody))
                except Exception as exc:
                    if self._is_unique_violation(exc):
                        raise AlreadyExists(
                            f"run {stored.run.id!r} already exists in the ledger"
                        ) from exc
                    raise
                ords.append((stored.ord, int(c.fetchone()[0])))
            encoded: list[tuple[Any, ...]] = []
            size = 0
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
                size += len(encoded[-1][5])
                if len(encoded) >= _IMPORT_CHUNK or size >= _IMPORT_CHUNK_BYTES:
                    self._insert_rows(c, encoded)
                    encoded, size = [], 0
            self._insert_rows(c, encoded)
            ids: list[tuple[int, int]] = []
            for stored_note in sorted(notes, key=lambda n: n.id):
                n = stored_note.note
                c.execute(
                    _COPY_NOTE,
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
                ids.append((stored_note.id, int(c.fetchone()[0])))
            for s in sessions:
                if s.fork is not None:
                    c.execute(
                        "UPDATE sessions SET fork_ord = ?, fork_note = ? WHERE id = ?",
                        (_bound(ords, s.fork.ord), _bound(ids, s.fork.note), s.session.id),
                    )
            for e in erasures:
                selector = canonical_json(e.selector)
                c.execute(
                    "SELECT counts FROM erasures WHERE at = ? AND actor = ? AND selector = ?",
                    (e.at, e.actor, selector),
                )
                if any(json.loads(r[0]) == e.counts for r in c.fetchall()):
                    continue
                c.execute(
                    "INSERT INTO erasures (at, actor, selector, counts) VALUES (?, ?, ?, ?)",
                    (e.at, e.actor, selector, canonical_json(e.counts)),
                )

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
                c.execute(_INSERT_SESSION, _session_params(s))
            except Exception as exc:
                if self._is_unique_violation(exc):
                    raise AlreadyExists(f"session {s.id!r} already exists in the ledger") from exc
                raise
        for run in runs:
            try:
                c.execute(_INSERT_RUN, _run_params(run))
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
                self._insert_rows(c, encoded)
                encoded = []
        if encoded:
            self._insert_rows(c, encoded)
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

    def __init__(self, ledger: SqlBase, cursor: Cursor) -> None:
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
        self._c.execute(_INSERT_SESSION, _session_params(s))
        self._last[s.id] = 0

    def run(self, run: Run) -> None:
        self._c.execute(_INSERT_RUN, _run_params(run))

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
            self._ledger._insert_rows(self._c, self._rows)
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
