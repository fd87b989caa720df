"""The shared ledger: PostgreSQL (``postgresql://USER@HOST/DB``), for several tether hosts.

The operations are :class:`~tether.ledger.sql.SqlLedger`'s, written once; this module supplies
connections (a psycopg 3 ``ConnectionPool``), runs the migrations of
:mod:`tether.ledger.ddl.postgres`, and rewrites the portable ``?`` placeholders to psycopg's
``%s``.

Isolation: READ COMMITTED (PostgreSQL's default), on purpose. Every step write begins with

    UPDATE runs SET … WHERE id = %s AND epoch = %s AND status = 'running'

which takes the run's row lock and holds it until the transaction commits. A concurrent claim
(``UPDATE runs SET epoch = epoch + 1 …``) waits for that lock, so it commits after the write; a
write that arrives after a claim waits for the claim and then re-checks its WHERE clause against
the newly committed row (READ COMMITTED re-evaluates an UPDATE's condition on the latest row
version), sees the new epoch and changes nothing (``FencedOut``). Either way no stale write can
slip in between the check and the write. Dense ``seq`` works the same way: ``UPDATE sessions SET
last_seq = last_seq + n … RETURNING last_seq`` locks the session's row until commit, so
concurrent appends to a session take consecutive ranges, and a rolled-back append rolls its
increment back too. REPEATABLE READ or SERIALIZABLE would add nothing here and turn every such
wait into a serialization failure that the caller would have to retry. Lock order is always run,
then session, so appends on different runs of one session cannot deadlock.

Reads run in autocommit: each statement sees the latest committed state. A tail read pages down
by ``seq < below``, and rows are append-only, so its pages are consistent without a snapshot.

Tables live in the first schema of the connection's ``search_path``; to keep tether's tables
apart from others, name a schema in the URL:
``postgresql://tether@db/ops?options=-csearch_path%3Dtether`` (the schema must exist).

Full-text search (recall) reads the index described in :mod:`tether.ledger.ddl.postgres`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from tether.errors import BadLedgerUrl, LedgerError, StorageError
from tether.ledger.base import Engine
from tether.ledger.codec import ROW_COLS, Cursor
from tether.ledger.ddl.postgres import (
    FTS_DOCUMENT,
    FTS_MAX_CHARS,
    FTS_SESSION_DOCUMENT,
    FTS_SESSION_QUERY,
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
)
from tether.ledger.sql import SqlLedger

__all__ = [
    "FTS_DOCUMENT",
    "FTS_MAX_CHARS",
    "FTS_SESSION_DOCUMENT",
    "FTS_SESSION_QUERY",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "PostgresLedger",
]


_VERSION_TABLE = "tether_schema"
# The advisory lock that serializes migrations: one per schema, so ledgers in different
# schemas of one database migrate independently.
_MIGRATE_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtext('tether.ledger.migrate:' || current_schema()))"
)
# The pool logs each dead connection it discards as a warning; tether reports what matters
# itself (a ConnectionLost that outlasts the retries), so a CLI's stderr stays one line.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

_POOL_MAX = 10
_CONNECT_TIMEOUT_S = 10
RETRY_WINDOW_S = 30.0
"""How long an operation keeps retrying after its connection was lost (a restarted server, a
terminated backend, a failover) before the loss is reported."""

# SQLSTATEs of a connection that the server ended or refused: the operation may be retried on a
# new connection. (Class 08 is "connection exception".)
_CONNECTION_LOST = {"57P01", "57P02", "57P03"}


# Every writer of rows (appends, imports, copies) sends them with COPY, in its transaction:
# against executemany's statement a row (pipelined), it took two thirds of the time for 1 writer
# and about half for 4 and 8, with the GIN index (bench/ledger.py's PostgreSQL appends).
_COPY_ROWS = f"COPY rows ({ROW_COLS}, text) FROM STDIN"


class ConnectionLost(StorageError):
    """The connection to the PostgreSQL ledger was lost; the operation may be retried."""


@functools.lru_cache(maxsize=512)
def _dialect(sql: str) -> str:
    """``?`` placeholders to psycopg's ``%s`` (a literal ``%`` doubles first)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _PgCursor:
    """A psycopg cursor that speaks the portable statements of :mod:`tether.ledger.sql`."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    @property
    def raw(self) -> psycopg.Cursor[Any]:
        """psycopg's own cursor (COPY)."""
        return self._cur

    def execute(self, sql: str, params: Sequence[Any] | None = None, /) -> Any:
        if params is None:
            return self._cur.execute(sql)
        return self._cur.execute(_dialect(sql), params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any:
        return self._cur.executemany(_dialect(sql), params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()


def _redacted(url: str) -> str:
    """The URL as errors show it: without a password."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparsable URL>"
    user = params.get("user", "")
    host = params.get("host", "")
    port = params.get("port", "")
    db = params.get("dbname", "")
    return f"postgresql://{user}@{host}{':' + str(port) if port else ''}/{db}"


class PostgresLedger(SqlLedger):
    """The ledger on PostgreSQL, through a pool of autocommit connections; write transactions
    are opened explicitly (READ COMMITTED; see the module docstring for why that suffices)."""

    engine = Engine.POSTGRES

    def __init__(
        self, url: str, *, pool_max: int = _POOL_MAX, retry_window_s: float = RETRY_WINDOW_S
    ) -> None:
        self.url = url
        self._where = _redacted(url)
        self.retry_window_s = retry_window_s
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise BadLedgerUrl(f"not a PostgreSQL ledger URL: {exc}") from exc
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = _CONNECT_TIMEOUT_S
        try:
            with psycopg.connect(url, **kwargs) as conn:
                self._migrate(conn)
        except psycopg.OperationalError as exc:
            raise StorageError(
                f"cannot reach the PostgreSQL ledger at {self._where}: {_one_line(exc)}; check "
                "that the server runs and the URL's user may connect"
            ) from exc
        except psycopg.errors.DuplicateTable as exc:
            raise LedgerError(
                f"the schema of {self._where} holds tables of another program "
                f"({_one_line(exc)}) and no tether schema version; name a schema of its own in "
                "the URL (options=-csearch_path%3D…)"
            ) from exc
        except psycopg.Error as exc:
            raise self._error(exc) from exc
        self._pool = ConnectionPool(
            url,
            kwargs=kwargs,
            min_size=1,
            max_size=pool_max,
            open=True,
            name=f"tether-ledger {self._where}",
        )

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            schema = conn.execute("SELECT current_schema()").fetchone()
            if schema is None or schema[0] is None:
                raise LedgerError(
                    f"the search_path of {self._where} names no existing schema; create the "
                    "schema first (CREATE SCHEMA …) or fix the URL's options=-csearch_path%3D…"
                )
            conn.execute(_MIGRATE_LOCK)
            # Look before creating: CREATE … IF NOT EXISTS needs the CREATE privilege even when
            # the table exists, and a user granted only the tables must still open the ledger.
            exists = conn.execute(
                "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = %s",
                (_VERSION_TABLE,),
            ).fetchone()
            if exists is None:
                conn.execute(f"CREATE TABLE {_VERSION_TABLE} (version INTEGER NOT NULL)")
            row = conn.execute(f"SELECT version FROM {_VERSION_TABLE}").fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise LedgerError(
                    f"the ledger at {self._where} (schema {schema[0]}) has schema version "
                    f"{version}, newer than this tether ({SCHEMA_VERSION}); upgrade tether"
                )
            # A new ledger is created from the schema, an older one migrated to it (the two are
            # the same: tests/test_ledger_ddl.py).
            for script in [SCHEMA] if version == 0 else MIGRATIONS[version:]:
                conn.execute(script)
            if row is None:
                conn.execute(
                    f"INSERT INTO {_VERSION_TABLE} (version) VALUES (%s)", (SCHEMA_VERSION,)
                )
            elif version != SCHEMA_VERSION:
                conn.execute(f"UPDATE {_VERSION_TABLE} SET version = %s", (SCHEMA_VERSION,))

    def _error(self, exc: psycopg.Error, conn: psycopg.Connection[Any] | None = None) -> Exception:
        """psycopg's error as tether's: what happened to which ledger, and what to do."""
        state = exc.sqlstate or ""
        where = f"the PostgreSQL ledger at {self._where}"
        if (
            (conn is not None and conn.broken)
            or state.startswith("08")
            or state in _CONNECTION_LOST
        ):
            return ConnectionLost(
                f"the connection to {where} was lost ({_one_line(exc)}); check that the server "
                "runs, then retry"
            )
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return StorageError(
                f"{where} refused: {_one_line(exc)}; grant the URL's user SELECT, INSERT and "
                "UPDATE on tether's tables (or use the user that owns them)"
            )
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            return StorageError(
                f"{where} is read-only ({_one_line(exc)}); reads work, writes need the primary"
            )
        if state.startswith("53"):  # insufficient resources: disk full, out of memory
            return StorageError(f"{where} is out of resources ({_one_line(exc)}); free space")
        if isinstance(exc, psycopg.DataError):
            # e.g. a NUL character, which PostgreSQL text cannot hold (SQLite can).
            return StorageError(f"{where} refused a value: {_one_line(exc)}")
        return StorageError(f"{where} failed: {_one_line(exc)}")

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        conn: psycopg.Connection[Any] | None = None
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise ConnectionLost(
                f"no connection to the PostgreSQL ledger at {self._where}: {_one_line(exc)}; "
                "check that the server runs and accepts connections"
            ) from exc
        except psycopg.Error as exc:
            if self._is_unique_violation(exc):
                raise  # the operations turn it into AlreadyExists, or dedupe on it
            raise self._error(exc, conn) from exc

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Cursor]:
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield _PgCursor(cur)

    @contextlib.contextmanager
    def _read(self) -> Iterator[Cursor]:
        with self._connection() as conn, conn.cursor() as cur:
            yield _PgCursor(cur)

    def _is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation)

    def _insert_rows(self, c: Cursor, encoded: Sequence[tuple[Any, ...]]) -> None:
        if not encoded:
            return
        cur = cast(_PgCursor, c).raw  # this ledger's cursors (or a wrapper of one) have it
        with cur.copy(_COPY_ROWS) as copy:
            for e in encoded:
                copy.write_row(e)

    def _lock_session(self, c: Cursor, session_id: str, *, wait: bool = True) -> bool:
        # A transaction-scoped advisory lock per session serializes claims on it across
        # processes and hosts without touching the run and session rows that appends lock.
        key = "tether.custody:" + session_id
        if wait:
            c.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ?))", (key,))
            return True
        c.execute("SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || ?))", (key,))
        return bool(c.fetchone()[0])

    def _lock_actor(self, c: Cursor, actor: str) -> None:
        # Per actor, as per session above: the limits' counts and the insert they admit are
        # serialized across processes and hosts (READ COMMITTED: the count, taken after the
        # lock, sees every run the lock's last holder committed).
        c.execute(
            "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ?))",
            ("tether.actor:" + actor,),
        )

    def close(self) -> None:
        self._pool.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


_F = TypeVar("_F", bound=Callable[..., Any])


def _retried(method: _F) -> _F:
    """Run ``method`` again on a new connection when its connection was lost, until the
    ledger's retry window ends. Only for reads and idempotent writes: a lost connection may
    have lost the acknowledgement of a commit, and appends are idempotent by pi entry id (and a
    run's request row by the run), a refusal or an extra merged again is the same. Writes that
    are not (a new session, run or note, a claim, a run's end) raise ``ConnectionLost``: their
    callers know whether a second try is the same."""

    @functools.wraps(method)
    def wrapper(self: PostgresLedger, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + self.retry_window_s
        delay = 0.05
        while True:
            try:
                return method(self, *args, **kwargs)
            except ConnectionLost:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    return wrapper  # type: ignore[return-value]


for _name in (
    "session",
    "sessions",
    "session_overview",
    "session_free",
    "last_seq",
    "set_refusing",
    "run",
    "runs",
    "lease",
    "live_runs",
    "queued_runs",
    "waited_heads",
    "expired_leases",
    "append",
    "update_run_extra",
    "search",
    "run_rows_before",
    "notes",
    "all_notes",
    "row",
    "latest_compaction",
    "last_ended_run",
    "ended_runs",
    "run_first_seq",
    "rows_range",
    "row_sizes",
    "tail",
):
    setattr(PostgresLedger, _name, _retried(getattr(SqlLedger, _name)))
