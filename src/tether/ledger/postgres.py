"""The shared ledger: PostgreSQL (``postgresql://USER@HOST/DB``), for several tether hosts.

The operations are :class:`~tether.ledger.sql.SqlLedger`'s, written once; this module supplies
connections (a psycopg 3 ``ConnectionPool``), the DDL and its migrations, and rewrites the
portable ``?`` placeholders to psycopg's ``%s``.

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

Full-text search (recall) reads ``rows.text`` through a GIN index on
:data:`FTS_SESSION_DOCUMENT` (the words of :data:`FTS_DOCUMENT` and a lexeme naming the row's
session); use that exact expression in a query so PostgreSQL uses the index, and AND the words
with the session's lexeme so that it reads that session's matches alone, e.g.
``WHERE FTS_SESSION_DOCUMENT @@ (websearch_to_tsquery('simple', %s) && FTS_SESSION_QUERY)``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from tether.errors import BadLedgerUrl, LedgerError, StorageError
from tether.ledger.sql import ROW_COLUMNS, Cursor, SqlLedger

__all__ = [
    "FTS_DOCUMENT",
    "FTS_MAX_CHARS",
    "FTS_SESSION_DOCUMENT",
    "FTS_SESSION_QUERY",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "PostgresLedger",
]

# A tsvector may not exceed 1 MB, and to_tsvector raises (failing the append) when it would.
# The worst text measured (two-character CJK words, all distinct) takes 4.7 bytes of tsvector
# per character, so the first 100,000 characters of a row are indexed: at most ~470 KB.
FTS_MAX_CHARS = 100_000
# PostgreSQL's parser keeps paths, host names and file names whole ("kv/quokka", "app.yaml"),
# where SQLite's unicode61 splits them: the characters that join them become spaces first, so a
# word inside them is found on both backends.
_FTS_JOINERS = "/.:@=\\"
FTS_DOCUMENT = (
    f"to_tsvector('simple', translate(left(text, {FTS_MAX_CHARS}), "
    f"'{_FTS_JOINERS}', '{' ' * (len(_FTS_JOINERS))}'))"
)
# The index recall searches (migration 7) holds, beside a row's words, one lexeme naming its
# session: "session " and the md5 of the session id (a space never occurs in a parsed word, and
# the hash keeps the lexeme short whatever the id). A search asks for that lexeme AND its words,
# so the GIN index yields the session's matches alone: its work follows the rarer of the two
# (the session's rows or the words' matches), never other sessions' matches. Ranking still reads
# FTS_DOCUMENT, so it is unchanged.
FTS_SESSION_DOCUMENT = f"({FTS_DOCUMENT} || array_to_tsvector(ARRAY['session ' || md5(session)]))"
FTS_SESSION_QUERY = "('''session ' || md5(?) || '''')::tsquery"
"""The tsquery of a session's lexeme in :data:`FTS_SESSION_DOCUMENT` (its id is the parameter)."""
# A search ranks at most this many matches of a session (ranking re-parses each row's text).
RANK_CANDIDATES = 1000
_FTS_DOCUMENT_V1 = f"to_tsvector('simple', left(text, {FTS_MAX_CHARS}))"

# Each entry migrates from version i to i + 1. Append, never edit: a ledger on disk replays them.
# Bodies, extras and timestamps are TEXT exactly as SQLite stores them (canonical JSON, the
# interchange timestamps), so both backends return byte-identical records; every TEXT column
# collates as "C" (code point order, like SQLite's BINARY), so listings sort the same on both
# whatever the database's locale.
MIGRATIONS: list[str] = [
    f"""
    CREATE TABLE sessions (
        id        TEXT COLLATE "C" PRIMARY KEY,
        created   TEXT COLLATE "C" NOT NULL,
        last_seq  BIGINT NOT NULL DEFAULT 0,
        refusing  TEXT COLLATE "C",
        extra     TEXT COLLATE "C" NOT NULL DEFAULT '{{}}'
    );
    CREATE TABLE runs (
        ord          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id           TEXT COLLATE "C" NOT NULL UNIQUE,
        session      TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        agent        TEXT COLLATE "C" NOT NULL,
        status       TEXT COLLATE "C" NOT NULL CHECK (status IN
                         ('queued', 'running', 'finished', 'failed', 'interrupted')),
        request_seq  BIGINT,
        started      TEXT COLLATE "C",
        ended        TEXT COLLATE "C",
        epoch        BIGINT NOT NULL DEFAULT 0,
        extra        TEXT COLLATE "C" NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX runs_by_session ON runs (session, ord);
    CREATE INDEX runs_ended ON runs (session, agent, ord)
        WHERE status IN ('finished', 'failed', 'interrupted');
    CREATE TABLE rows (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session      TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        seq          BIGINT NOT NULL,
        run          TEXT COLLATE "C" REFERENCES runs(id),
        actor        TEXT COLLATE "C" NOT NULL,
        kind         TEXT COLLATE "C" NOT NULL CHECK (kind IN ('message', 'compaction', 'receipt')),
        body         TEXT COLLATE "C" NOT NULL,
        sources      TEXT COLLATE "C" NOT NULL DEFAULT '[]',
        bytes        BIGINT NOT NULL,
        media_bytes  BIGINT NOT NULL DEFAULT 0,
        entry_id     TEXT COLLATE "C",
        extra        TEXT COLLATE "C" NOT NULL DEFAULT '{{}}',
        text         TEXT COLLATE "C" NOT NULL DEFAULT '',
        UNIQUE (session, seq)
    );
    CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL;
    CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction';
    CREATE INDEX rows_fts ON rows USING gin ({_FTS_DOCUMENT_V1});
    CREATE TABLE notes (
        id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session  TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        agent    TEXT COLLATE "C" NOT NULL,
        text     TEXT COLLATE "C" NOT NULL,
        at       TEXT COLLATE "C" NOT NULL,
        bytes    BIGINT NOT NULL,
        extra    TEXT COLLATE "C" NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX notes_by_agent ON notes (session, agent, id);
    """,
    # 2: the follow-up view asks whether a run wrote any row (SqlLedger.run_first_seq).
    "CREATE INDEX rows_by_run ON rows (run, seq);",
    # 3: the tail reads row sizes before bodies (SqlLedger.tail); this index covers that scan.
    "CREATE INDEX rows_sizes ON rows (session, seq, bytes);",
    # 4: session custody (DESIGN §3.7): leases, placements, idempotent requests, the queue.
    """
    ALTER TABLE runs ADD COLUMN lease_expires DOUBLE PRECISION;
    ALTER TABLE runs ADD COLUMN owner TEXT COLLATE "C";
    ALTER TABLE runs ADD COLUMN placement TEXT COLLATE "C";
    ALTER TABLE runs ADD COLUMN request_id TEXT COLLATE "C";
    CREATE UNIQUE INDEX runs_by_request ON runs (session, request_id)
        WHERE request_id IS NOT NULL;
    CREATE INDEX runs_queued ON runs (session, ord) WHERE status = 'queued';
    CREATE INDEX runs_live ON runs (session) WHERE status = 'running';
    """,
    # 5: a note names the actor of the run that wrote it, the run, and the sources it carries.
    """
    ALTER TABLE notes ADD COLUMN actor TEXT COLLATE "C";
    ALTER TABLE notes ADD COLUMN run TEXT COLLATE "C";
    ALTER TABLE notes ADD COLUMN sources TEXT COLLATE "C" NOT NULL DEFAULT '[]';
    """,
    # 6: recall's index splits paths and host names into their words (FTS_DOCUMENT).
    f"""
    DROP INDEX rows_fts;
    CREATE INDEX rows_fts ON rows USING gin ({FTS_DOCUMENT});
    """,
    # 7: recall's index names each row's session too (FTS_SESSION_DOCUMENT), so a search reads
    # only its session's matches.
    f"""
    DROP INDEX rows_fts;
    CREATE INDEX rows_fts ON rows USING gin ({FTS_SESSION_DOCUMENT});
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
_R_COLS = ", ".join(f"r.{col}" for col in ROW_COLUMNS)

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
            for i in range(version, SCHEMA_VERSION):
                conn.execute(MIGRATIONS[i])
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

    def _search_query(
        self,
        words: Sequence[str],
        session_id: str,
        seqs: tuple[int, int],
        limit: int,
        offset: int,
        snippet_chars: int,
    ) -> tuple[str, list[Any]]:
        # Any of the words (each a plainto_tsquery, so no query syntax reaches the parser), AND
        # the session's lexeme: the match is answered by the GIN index on FTS_SESSION_DOCUMENT
        # alone, and yields only this session's matches. No condition there names the session
        # or the seq (the (session, seq) index serves a seq range too, scanned whole), so the
        # planner cannot walk rows and parse every one instead, as it would without statistics.
        # Words that parse to no lexeme make an empty query, which matches nothing (ANDed with
        # an empty query the session's lexeme would match every row: numnode keeps it empty).
        # The matches are materialized, then checked against the session itself (md5 may
        # collide) and the seq range. Ranking re-parses a row's text, so at most
        # RANK_CANDIDATES matches of the session (the newest) are ranked; ts_headline runs for
        # the hits alone.
        query = " || ".join("plainto_tsquery('simple', ?)" for _ in words)
        words_per = max(8, min(60, snippet_chars // 7))
        sql = (
            "WITH matched AS MATERIALIZED (SELECT id, seq, session FROM rows "
            f"WHERE {FTS_SESSION_DOCUMENT} @@ (({query}) && {FTS_SESSION_QUERY}) "
            f"AND numnode({query}) > 0), "
            "candidates AS (SELECT id, seq FROM matched WHERE session = ? AND seq >= ? "
            "AND seq <= ? ORDER BY seq DESC LIMIT ?), "
            f"hits AS (SELECT c.id, c.seq, ts_rank({FTS_DOCUMENT}, {query}) AS rank "
            "FROM candidates c JOIN rows r ON r.id = c.id "
            "ORDER BY rank DESC, c.seq LIMIT ? OFFSET ?) "
            f"SELECT {_R_COLS}, ts_headline('simple', left(r.text, {FTS_MAX_CHARS}), "
            f"{query}, ?) FROM hits JOIN rows r ON r.id = hits.id ORDER BY hits.rank DESC, r.seq"
        )
        options = f'MaxWords={words_per}, MinWords={words_per // 2}, StartSel="", StopSel=""'
        params = [
            *words,
            session_id,
            *words,
            session_id,
            *seqs,
            RANK_CANDIDATES,
            *words,
            limit,
            offset,
            *words,
            options,
        ]
        return sql, params

    def _is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation)

    def _lock_session(self, c: Cursor, session_id: str, *, wait: bool = True) -> bool:
        # A transaction-scoped advisory lock per session serializes claims on it across
        # processes and hosts without touching the run and session rows that appends lock.
        key = "tether.custody:" + session_id
        if wait:
            c.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ?))", (key,))
            return True
        c.execute("SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || ?))", (key,))
        return bool(c.fetchone()[0])

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
