"""Interchange import: records written as they are (``ledger load`` streams a file through an
:class:`Importer`; ``ledger copy`` writes another ledger's sessions), in one transaction, rows in
bounded batches."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tether.errors import AlreadyExists
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

__all__ = ["DuplicateEntry", "ImportSql", "Importer"]

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

    def copy_in(
        self,
        sessions: Sequence[Session],
        runs: Sequence[Run],
        rows: Iterable[Row],
        notes: Sequence[Note],
        *,
        adopt: Sequence[str] = (),
    ) -> None:
        """:meth:`import_records` for ``ledger copy``: rows are consumed as they come, and the
        sessions named in ``adopt`` (empty sessions of this ledger, say ones made by
        ``ensure_session``) are taken over by the copy, in the same transaction."""
        with self._tx() as c:
            for sid in adopt:
                # Taken over only if it is still empty; otherwise the insert below is refused.
                c.execute(
                    "DELETE FROM sessions WHERE id = ? AND last_seq = 0 "
                    "AND NOT EXISTS (SELECT 1 FROM runs WHERE session = ?) "
                    "AND NOT EXISTS (SELECT 1 FROM notes WHERE session = ?)",
                    (sid, sid, sid),
                )
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
