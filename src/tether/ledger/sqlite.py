"""The embedded ledger: SQLite in WAL mode (``sqlite:///path``), or in memory (``memory:``)."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tether.config import ledger_file
from tether.errors import BadLedgerUrl, LedgerError, StorageError
from tether.files import private_dir, private_file
from tether.ledger.base import Engine
from tether.ledger.codec import ROW_COLS, Cursor
from tether.ledger.ddl.sqlite import FTS_KEY_SPAN, MIGRATIONS, SCHEMA, SCHEMA_VERSION
from tether.ledger.sql import SqlLedger

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SQLiteLedger"]

BUSY_TIMEOUT_S = 30.0

# Rows one INSERT statement carries at most (a power of two; 13 parameters a row stays under
# SQLite's oldest default limit of 999 parameters a statement).
_INSERT_CHUNK = 64
_WIDTH = 13  # the columns of codec.encode_row's tuple, then the row's key in rows_fts


@functools.lru_cache(maxsize=8)
def _insert_many(n: int) -> str:
    """One INSERT of ``n`` rows: encode_row's tuples, each followed by the row's key in the
    full-text index (migration 7), laid end to end."""
    row = "(" + ", ".join("?" for _ in range(_WIDTH)) + ")"
    return f"INSERT INTO rows ({ROW_COLS}, text, fts_key) VALUES {', '.join([row] * n)}"


# Rows just inserted into the full-text index, from their stored text, by their keys (rowids):
# an append's keys are one range; an import's batch may span sessions, so it gives a list.
_INDEX_RANGE = (
    "INSERT INTO rows_fts (rowid, text) SELECT fts_key, text FROM rows "
    "WHERE fts_key BETWEEN ? AND ?"
)


@functools.lru_cache(maxsize=8)
def _index_keys(n: int) -> str:
    marks = ", ".join("?" * n)
    return (
        f"INSERT INTO rows_fts (rowid, text) SELECT fts_key, text FROM rows "
        f"WHERE fts_key IN ({marks})"
    )


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


# What SQLite's primary result codes mean to someone running tether, and what to do about them.
_ADVICE = {
    "SQLITE_BUSY": "it stayed locked by another process for over {busy:.0f} s; retry when that "
    "process is done, or stop it",
    "SQLITE_LOCKED": "it stayed locked by another process for over {busy:.0f} s; retry when that "
    "process is done, or stop it",
    "SQLITE_FULL": "the disk (or the ledger's size limit) is full; free space, then retry",
    "SQLITE_READONLY": "it is read-only (the file, its directory or its filesystem); reads work, "
    "writes need write access",
    "SQLITE_CANTOPEN": "it cannot be opened; check that the path exists and is accessible",
    "SQLITE_PERM": "permission was denied; check the access rights of the file and its directory",
    "SQLITE_AUTH": "permission was denied; check the access rights of the file and its directory",
    "SQLITE_NOTADB": "it is not a SQLite database; point the ledger URL at a tether ledger or a "
    "new file",
    "SQLITE_CORRUPT": "the database file is corrupt; restore it from a backup (or `tether ledger "
    "copy` what still reads into a new ledger)",
    "SQLITE_IOERR": "the disk reported an I/O error; check the disk and free space, then retry",
}
_ACCESS = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")


def _primary(exc: sqlite3.Error) -> str:
    """The primary result code's name: SQLITE_READONLY_DBMOVED → SQLITE_READONLY."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if not name and "locked" in str(exc):
        return "SQLITE_BUSY"
    return "_".join(name.split("_")[:2])


def _check_not_foreign(conn: sqlite3.Connection, path: str) -> None:
    """A database without tether's schema version must be empty: a foreign database is
    refused, never written into."""
    # One read transaction: another process may be creating the ledger meanwhile, and two
    # reads on their own could see its version before the commit and its tables after.
    conn.execute("BEGIN")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] != 0:
            return  # a tether ledger (the usual case: one read)
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name LIMIT 6"
            )
        ]
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    if names:
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        raise LedgerError(
            f"{path} is a SQLite database but not a tether ledger (it holds tables {shown}); "
            "give tether a new file, or the path of its own ledger"
        )


class SQLiteLedger(SqlLedger):
    """One connection, serialized by a lock; WAL lets other processes read while it writes, and
    ``BEGIN IMMEDIATE`` makes every write transaction take the write lock up front.

    sqlite3's errors are translated here, at the edge, into :class:`StorageError` naming the
    file and what to do. A ledger that cannot be written (a read-only file, directory or
    filesystem) is opened read-only: reads work, writes fail with that error."""

    # Without statistics SQLite may walk rows_heads (session, seq, …) backwards and filter
    # on kind, reading every row of the session: pin the partial index of compactions.
    _compactions_hint = "INDEXED BY rows_compactions"
    engine = Engine.SQLITE
    read_only = False

    def __init__(self, url: str) -> None:
        self.url = url
        if url == "memory:":
            target = ":memory:"
        elif url.startswith("sqlite:"):
            self.path = ledger_file(url)
            target = str(self.path)
        else:
            raise BadLedgerUrl(
                f"not a SQLite ledger URL: {url!r} "
                "(use sqlite:///ABSOLUTE/PATH, sqlite:RELATIVE/PATH or memory:)"
            )
        self._target = target
        self._lock = threading.RLock()
        self._conn = self._open(target)
        try:
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    def _error(self, exc: sqlite3.Error) -> LedgerError:
        code = _primary(exc)
        advice = _ADVICE.get(code)
        where = "the in-memory ledger" if self.path is None else f"the SQLite ledger {self.path}"
        if advice is None:
            return StorageError(f"{where} failed: {exc}")
        return StorageError(f"{where} failed ({exc}): {advice.format(busy=BUSY_TIMEOUT_S)}")

    def _open(self, target: str) -> sqlite3.Connection:
        if self.path is not None:
            # Private (0700 directory, 0600 file: SQLite gives its -wal and -shm files the
            # database file's mode). A ledger we may not change is still read: SQLite says
            # what it cannot do.
            with contextlib.suppress(OSError):
                if not self.path.parent.exists():
                    private_dir(self.path.parent)
                private_file(self.path)
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(
                target, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            if target != ":memory:":
                _check_not_foreign(conn, target)  # before WAL, which would change the file
                _enter_wal(conn)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            # Freed content is zeroed, so an erased row's text does not linger in free space
            # (docs/operations.md#erasure-and-retention).
            conn.execute("PRAGMA secure_delete = ON")
            return conn
        except LedgerError:
            if conn is not None:
                conn.close()
            raise
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            if _primary(exc) not in _ACCESS or not Path(target).is_file():
                raise self._error(exc) from exc
            first = exc
        # Cannot write it: open it for reading. `mode=ro` serves a read-only file in a writable
        # directory; a read-only filesystem cannot hold WAL's shared-memory file, which only
        # `immutable=1` does without (the ledger cannot change under us: nobody can write it).
        for flags in ("mode=ro", "immutable=1"):
            wal = Path(f"{target}-wal")
            if flags == "immutable=1" and wal.exists() and wal.stat().st_size > 0:
                # immutable=1 would not see the changes still in the WAL file
                raise StorageError(
                    f"the SQLite ledger {target} cannot be written, and its latest changes are "
                    f"still in {wal}, which cannot be read without write access; open it once "
                    "with write access (any tether command) to fold them in"
                ) from first
            ro: sqlite3.Connection | None = None
            try:
                ro = sqlite3.connect(
                    f"file:{urllib.parse.quote(target)}?{flags}",
                    uri=True,
                    timeout=BUSY_TIMEOUT_S,
                    isolation_level=None,
                    check_same_thread=False,
                )
                ro.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.Error:
                if ro is not None:
                    ro.close()
                continue
            self.read_only = True
            return ro
        raise self._error(first) from first

    def _migrate(self) -> None:
        with self._lock:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version == SCHEMA_VERSION:
                return
            if self.read_only:
                raise StorageError(
                    f"the SQLite ledger {self.path} is read-only and has schema version "
                    f"{version}, not {SCHEMA_VERSION}: open it once with write access to migrate it"
                )
            # Several processes may open a new ledger at once: the version is read again under
            # the write lock, so exactly one of them migrates.
            with self._tx() as c:
                version = c.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise LedgerError(
                        f"the ledger at {self.url} has schema version {version}, newer than "
                        f"this tether ({SCHEMA_VERSION}); upgrade tether"
                    )
                # A new ledger is created from the schema, an older one migrated to it (the two
                # are the same: tests/test_ledger_ddl.py).
                for script in [SCHEMA] if version == 0 else MIGRATIONS[version:]:
                    for statement in _statements(script):
                        c.execute(statement)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Cursor]:
        with self._lock:
            try:
                cur = self._conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error(exc) from exc
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException as exc:
                # SQLite may have rolled back already (a full disk, an I/O error)
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        cur.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error) and not self._is_unique_violation(exc):
                    raise self._error(exc) from exc
                raise
            finally:
                cur.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[Cursor]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                yield cur
            except sqlite3.Error as exc:
                raise self._error(exc) from exc
            finally:
                cur.close()

    def _after_erase(self) -> None:
        # FTS5 records a deletion as a marker in a new segment: merging the index drops the
        # deleted entries from its segments. Then the WAL, which holds the pages as they were
        # before the erasure, is copied back and truncated.
        with self._tx() as c:
            c.execute("INSERT INTO rows_fts (rows_fts) VALUES ('optimize')")
        with self._lock:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    def _is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)

    def _insert_rows(self, c: Cursor, encoded: Sequence[tuple[Any, ...]]) -> None:
        # FTS5 writes its pending terms out as a new index segment at the start of every
        # statement that opens a savepoint once it holds any, and automerge merges them again.
        # A trigger a row (migration 7) made a segment per statement of rows; the rows go in
        # first now, in few statements of many rows, and then into rows_fts in one statement:
        # one segment per call (per append), in the same transaction. Chunk sizes are powers
        # of two, so the statements compiled stay few.
        if not encoded:
            return
        names = list(dict.fromkeys(e[0] for e in encoded))  # an import's batch may hold many
        span: dict[str, int] = {}
        for i in range(0, len(names), 500):
            part = names[i : i + 500]
            c.execute(
                f"SELECT id, num FROM sessions WHERE id IN ({', '.join('?' * len(part))})", part
            )
            span.update((sid, num * FTS_KEY_SPAN) for sid, num in c.fetchall() if num is not None)
        # A row of no session gets no key (a NULL INTEGER PRIMARY KEY is given the next rowid):
        # the session's foreign key refuses it.
        keys = [None if (base := span.get(e[0])) is None else base + e[1] for e in encoded]
        k = 0
        while k < len(encoded):
            n = min(_INSERT_CHUNK, 1 << ((len(encoded) - k).bit_length() - 1))
            params: list[Any] = []
            for e, key in zip(encoded[k : k + n], keys[k : k + n], strict=True):
                params.extend(e)
                params.append(key)
            c.execute(_insert_many(n), params)
            k += n
        first = keys[0]
        if first is not None and keys == list(range(first, first + len(keys))):
            # one session's consecutive seqs (every append): their keys are exactly this range
            c.execute(_INDEX_RANGE, (first, keys[-1]))
            return
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            c.execute(_index_keys(len(part)), part)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
