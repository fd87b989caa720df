"""The embedded ledger: SQLite in WAL mode (``sqlite:///path``), or in memory (``memory:``)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tether.errors import LedgerError
from tether.ledger.sql import Cursor, SqlLedger

__all__ = ["SCHEMA_VERSION", "SQLiteLedger"]

# Each entry migrates from version i to i + 1. Append, never edit: a ledger on disk replays them.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id        TEXT PRIMARY KEY,
        created   TEXT NOT NULL,
        last_seq  INTEGER NOT NULL DEFAULT 0,
        refusing  TEXT,
        extra     TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE runs (
        ord          INTEGER PRIMARY KEY AUTOINCREMENT,
        id           TEXT NOT NULL UNIQUE,
        session      TEXT NOT NULL REFERENCES sessions(id),
        agent        TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN
                         ('queued', 'running', 'finished', 'failed', 'interrupted')),
        request_seq  INTEGER,
        started      TEXT,
        ended        TEXT,
        epoch        INTEGER NOT NULL DEFAULT 0,
        extra        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX runs_by_session ON runs (session, ord);
    CREATE INDEX runs_ended ON runs (session, agent, ord)
        WHERE status IN ('finished', 'failed', 'interrupted');
    CREATE TABLE rows (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        session      TEXT NOT NULL REFERENCES sessions(id),
        seq          INTEGER NOT NULL,
        run          TEXT REFERENCES runs(id),
        actor        TEXT NOT NULL,
        kind         TEXT NOT NULL CHECK (kind IN ('message', 'compaction', 'receipt')),
        body         TEXT NOT NULL,
        sources      TEXT NOT NULL DEFAULT '[]',
        bytes        INTEGER NOT NULL,
        media_bytes  INTEGER NOT NULL DEFAULT 0,
        entry_id     TEXT,
        extra        TEXT NOT NULL DEFAULT '{}',
        text         TEXT NOT NULL DEFAULT '',
        UNIQUE (session, seq)
    );
    CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL;
    CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction';
    CREATE TABLE notes (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        session  TEXT NOT NULL REFERENCES sessions(id),
        agent    TEXT NOT NULL,
        text     TEXT NOT NULL,
        at       TEXT NOT NULL,
        bytes    INTEGER NOT NULL,
        extra    TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX notes_by_agent ON notes (session, agent, id);
    """,
    # 2: the follow-up view asks whether a run wrote any row (SqlLedger.run_first_seq).
    "CREATE INDEX rows_by_run ON rows (run, seq);",
    # 3: the tail reads row sizes before bodies (SqlLedger.tail); this index covers that scan.
    "CREATE INDEX rows_sizes ON rows (session, seq, bytes);",
    # 4: session custody (DESIGN §3.7): leases, placements, idempotent requests, the queue.
    """
    ALTER TABLE runs ADD COLUMN lease_expires REAL;
    ALTER TABLE runs ADD COLUMN owner TEXT;
    ALTER TABLE runs ADD COLUMN placement TEXT;
    ALTER TABLE runs ADD COLUMN request_id TEXT;
    CREATE UNIQUE INDEX runs_by_request ON runs (session, request_id)
        WHERE request_id IS NOT NULL;
    CREATE INDEX runs_queued ON runs (session, ord) WHERE status = 'queued';
    CREATE INDEX runs_live ON runs (session) WHERE status = 'running';
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
BUSY_TIMEOUT_S = 30.0


def _statements(script: str) -> Iterator[str]:
    """The statements of a migration, one at a time (``executescript`` would commit first)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    if pending.strip():
        yield pending  # incomplete: SQLite says what is wrong with it


def _enter_wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode (persistent, so usually a no-op read). Switching a new file
    needs an exclusive lock, and SQLite answers "database is locked" at once, without its busy
    handler, when another process is switching it too: retry until the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("could not switch the database to WAL: it stays locked")
        time.sleep(0.01)


class SQLiteLedger(SqlLedger):
    """One connection, serialized by a lock; WAL lets other processes read while it writes, and
    ``BEGIN IMMEDIATE`` makes every write transaction take the write lock up front."""

    # Without statistics SQLite may walk rows_sizes (session, seq, bytes) backwards and filter
    # on kind, reading every row of the session: pin the partial index of compactions.
    _compactions_hint = "INDEXED BY rows_compactions"

    def __init__(self, url: str) -> None:
        self.url = url
        if url == "memory:":
            target = ":memory:"
        elif url.startswith("sqlite:"):
            # sqlite:///var/lib/x.db is the absolute path /var/lib/x.db; sqlite:rel/x.db is
            # relative to the working directory.
            raw = url.removeprefix("sqlite:")
            raw = "/" + raw.lstrip("/") if raw.startswith("//") else raw
            target = str(Path(raw).resolve())
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        else:
            raise LedgerError(
                f"not a SQLite ledger URL: {url!r} "
                "(use sqlite:///ABSOLUTE/PATH, sqlite:RELATIVE/PATH or memory:)"
            )
        try:
            self._conn = sqlite3.connect(
                target, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            if target != ":memory:":
                _enter_wal(self._conn)
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open SQLite ledger at {target}: {exc}") from exc
        self._lock = threading.RLock()
        self._migrate()

    def _migrate(self) -> None:
        with self._lock:
            if self._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                return
            # Several processes may open a new ledger at once: the version is read again under
            # the write lock, so exactly one of them migrates.
            with self._tx() as c:
                version = c.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise LedgerError(
                        f"the ledger at {self.url} has schema version {version}, newer than "
                        f"this tether ({SCHEMA_VERSION}); upgrade tether"
                    )
                for i in range(version, SCHEMA_VERSION):
                    for statement in _statements(MIGRATIONS[i]):
                        c.execute(statement)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Cursor]:
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            else:
                cur.execute("COMMIT")
            finally:
                cur.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[Cursor]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                yield cur
            finally:
                cur.close()

    def _is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
