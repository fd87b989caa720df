"""What only the PostgreSQL ledger has: index-served bounded reads (checked with EXPLAIN), the
full-text index, migrations under an advisory lock, and clear errors at the connection edge."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pg import TEST_URL, fresh_schema_url
from tether.errors import LedgerError
from tether.ledger import NewRow, Note, Row, RowKind, Run, RunStatus, Session, open_ledger
from tether.ledger.postgres import (
    FTS_DOCUMENT,
    FTS_SESSION_DOCUMENT,
    FTS_SESSION_QUERY,
    SCHEMA_VERSION,
    PostgresLedger,
    _dialect,
)
from tether.ledger.sql import Cursor

SESSIONS = 4
ROWS = 5000  # per session
RUNS = 1000  # per session, over two agents
COMPACTION_EVERY = 700
COMPACTIONS_UNTIL = 1500  # then none: the newest compaction lies 3,600 rows back
HELPERS_UNTIL = 50  # then only the reviewer runs: the newest ended helper run lies far back
SCAN_BOUND = 600  # rows one scan of a bounded read may touch (its largest limit is 500)
LONG_RUN = 1500  # rows of the run "live"


def _records(sid: str) -> tuple[Session, list[Run], list[Row], list[Note]]:
    session = Session(id=sid, created="2026-11-29T10:00:00Z")
    per_run = ROWS // RUNS
    runs = [
        Run(
            id=f"{sid}-r{i}",
            session=sid,
            agent="helper" if i < HELPERS_UNTIL and i % 2 else "reviewer",
            status=(RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED)[i % 3],
            request_seq=i * per_run + 1,
            started="2026-11-29T10:00:01Z",
            ended="2026-11-29T10:00:02Z",
            epoch=1,
        )
        for i in range(RUNS)
    ]
    rows = []
    for seq in range(1, ROWS + 1):
        run = runs[(seq - 1) // per_run].id
        if seq % COMPACTION_EVERY == 0 and seq < COMPACTIONS_UNTIL:
            kind, body = RowKind.COMPACTION, {"summary": f"summary {seq}", "covers_to": seq - 1}
        else:
            word = "needle" if seq == 4242 else f"word{seq % 97}"
            kind = RowKind.MESSAGE
            body = {"role": "assistant", "content": [{"type": "text", "text": f"{word} {seq}"}]}
        rows.append(
            Row(sid, seq, run, "agent:reviewer", kind, body, (), 0, entry_id=f"{sid}-e{seq}")
        )
    notes = [Note(sid, "reviewer", f"note {i}", "2026-11-29T10:00:00Z") for i in range(1000)]
    return session, runs, rows, notes


@pytest.fixture(params=["fresh", "analyzed"])
def big(request: pytest.FixtureRequest) -> Iterator[tuple[str, PostgresLedger]]:
    """A ledger whose sessions are long enough that an unbounded read would show, either just
    written (no planner statistics yet: autovacuum is held off) or analyzed."""
    with fresh_schema_url() as url:
        ledger = open_ledger(url)
        assert isinstance(ledger, PostgresLedger)
        with psycopg.connect(url, autocommit=True) as conn:
            for table in ("sessions", "runs", "rows", "notes"):
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        for i in range(SESSIONS):
            session, runs, rows, notes = _records(f"s{i}")
            ledger.import_records([session], runs, rows, notes)
        live = ledger.create_run("s1", "reviewer", run_id="live")
        fence = ledger.claim_run(live.id)
        # A long run: the first row it wrote is read by index, not by sorting the run's rows.
        say = {"role": "assistant", "content": "working"}
        ledger.append(fence, [NewRow.message("agent:reviewer", say)] * LONG_RUN)
        if request.param == "analyzed":
            with psycopg.connect(url, autocommit=True) as conn:
                # This schema's tables only: a bare ANALYZE takes every schema in the database,
                # another test's half-loaded "fresh" one too, and its plans with them.
                conn.execute("ANALYZE sessions, runs, rows, notes")
        try:
            yield url, ledger
        finally:
            ledger.close()


class _Recording:
    """A cursor that notes every statement it is given (as psycopg receives it)."""

    def __init__(self, inner: Cursor, seen: list[tuple[str, tuple[Any, ...]]]) -> None:
        self._inner = inner
        self._seen = seen

    @property
    def rowcount(self) -> int:
        return self._inner.rowcount

    def execute(self, sql: str, params: Any = (), /) -> Any:
        self._seen.append((sql, tuple(params)))
        return self._inner.execute(sql, params)

    def executemany(self, sql: str, params: Any, /) -> Any:
        return self._inner.executemany(sql, params)

    @property
    def raw(self) -> Any:  # rows go in with COPY (PostgresLedger._insert_rows), not noted
        return self._inner.raw  # type: ignore[attr-defined]

    def fetchone(self) -> Any:
        return self._inner.fetchone()

    def fetchall(self) -> list[Any]:
        return self._inner.fetchall()


@contextlib.contextmanager
def recording(ledger: PostgresLedger) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    seen: list[tuple[str, tuple[Any, ...]]] = []
    read, tx = ledger._read, ledger._tx

    @contextlib.contextmanager
    def rec_read() -> Iterator[Cursor]:
        with read() as c:
            yield _Recording(c, seen)

    @contextlib.contextmanager
    def rec_tx() -> Iterator[Cursor]:
        with tx() as c:
            yield _Recording(c, seen)

    ledger._read = rec_read  # type: ignore[method-assign]
    ledger._tx = rec_tx  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del ledger._read, ledger._tx


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def plans(url: str, sql: str, params: tuple[Any, ...]) -> list[list[dict[str, Any]]]:
    """The executed plan (``EXPLAIN ANALYZE``, rolled back) of a statement for these values, and
    of the generic plan a prepared statement may switch to after a few runs, each as a list of
    plan nodes."""
    numbered = sql.split("?")
    prepared = "".join(f"{part}${i}" for i, part in enumerate(numbered[:-1], 1)) + numbered[-1]
    args = ", ".join(["%s"] * len(params))
    explain = "EXPLAIN (ANALYZE, FORMAT JSON)"
    out = []
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction(force_rollback=True):
        cur = psycopg.ClientCursor(conn)  # values inlined as literals, as a custom plan sees them
        [[doc]] = cur.execute(f"{explain} {_dialect(sql)}", params).fetchall()
        out.append(list(_nodes(doc[0]["Plan"])))
        cur.execute(f"PREPARE q AS {prepared}")
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        [[doc]] = cur.execute(f"{explain} EXECUTE q({args})", params).fetchall()
        out.append(list(_nodes(doc[0]["Plan"])))
    return out


LOG_TABLES = {"rows", "runs", "notes"}


def test_bounded_reads_are_index_scans(big: tuple[str, PostgresLedger]) -> None:
    url, ledger = big
    with recording(ledger) as seen:
        assert ledger.row("s2", 2500) is not None
        latest = ledger.latest_compaction("s2")
        assert latest is not None
        assert latest.seq == COMPACTIONS_UNTIL // COMPACTION_EVERY * COMPACTION_EVERY
        tail = ledger.tail("s2", 60_000)  # more than one page
        assert len(tail.rows) > 2 * 256
        assert ledger.tail("s2", 4000, after=4900).rows
        assert len(ledger.rows_range("s2", 1000, 4000, limit=500)) == 500
        ended = ledger.last_ended_run("s2", "helper")
        assert ended is not None
        assert ended.id == f"s2-r{HELPERS_UNTIL - 1}"
        assert len(ledger.notes("s2", "reviewer")) == 32
        assert ledger.last_seq("s2") == ROWS
        assert [r.id for r in ledger.ended_runs("s2", "helper", limit=3)] == [
            f"s2-r{HELPERS_UNTIL - 1}",
            f"s2-r{HELPERS_UNTIL - 3}",
            f"s2-r{HELPERS_UNTIL - 5}",
        ]
        assert ledger.run_first_seq("live") == ROWS + 1
        assert ledger.run_first_seq("s2-r7") == 7 * ROWS // RUNS + 1
        # The write path's reads: the fence, the entry-id lookup, the seq counter.
        fence = ledger.claim_run("live")
        ledger.append(
            fence,
            [
                NewRow.message("agent:reviewer", {"role": "assistant", "content": "x"}, entry_id=e)
                for e in ("s1-e17", "s1-e4000", "new-entry")
            ],
        )
    statements = list(dict.fromkeys(s for s in seen if not s[0].lstrip().startswith("INSERT")))
    assert len({sql for sql, _ in statements}) >= 11
    for sql, params in statements:
        for nodes in plans(url, sql, params):
            kinds = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
            on_log = [
                n
                for n in nodes
                if "Scan" in n["Node Type"] and n.get("Relation Name") in LOG_TABLES
            ]
            # Index, index-only or bitmap (index-driven) scans; never a sequential one.
            assert all(n["Node Type"] != "Seq Scan" for n in on_log), f"{sql!r}: {kinds}"
            # Rows read, kept or thrown away, must not grow with the session (ROWS each).
            read = [
                n["Actual Rows"] * n["Actual Loops"]
                + n.get("Rows Removed by Filter", 0)
                + n.get("Rows Removed by Index Recheck", 0)
                for n in on_log
            ]
            assert max(read, default=0) <= SCAN_BOUND, f"{sql!r} read {read} rows: {kinds}"
            if any(t in sql for t in ("FROM rows", "FROM runs", "FROM notes")):
                assert on_log, f"{sql!r}: {kinds}"


def test_full_text_search_uses_the_gin_index(big: tuple[str, PostgresLedger]) -> None:
    url, _ = big
    sql = (
        f"SELECT session, seq FROM rows WHERE {FTS_SESSION_DOCUMENT} @@ "
        f"(websearch_to_tsquery('simple', ?) && {FTS_SESSION_QUERY})"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(SESSIONS):
            found = conn.execute(_dialect(sql), ("needle", f"s{i}")).fetchall()
            assert found == [(f"s{i}", 4242)]
    for nodes in plans(url, sql, ("needle", "s1")):
        assert any(n.get("Index Name") == "rows_fts" for n in nodes), nodes


def test_a_search_reads_its_own_sessions_matches_alone(big: tuple[str, PostgresLedger]) -> None:
    url, ledger = big
    word = "word5"  # in every 97th row of every session
    compactions = {s for s in range(COMPACTION_EVERY, COMPACTIONS_UNTIL, COMPACTION_EVERY)}
    mine = len([s for s in range(1, ROWS + 1) if s % 97 == 5 and s not in compactions])
    hits = ledger.search("s2", [word], limit=8)
    assert len(hits) == 8
    assert {h.row.session for h in hits} == {"s2"}
    sql, params = ledger._search_query([word], "s2", (1, 2**62), 8, 0, 400)
    for nodes in plans(url, sql, params):
        kinds = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
        on_rows = [
            n for n in nodes if "Scan" in n["Node Type"] and n.get("Relation Name") == "rows"
        ]
        assert all(n["Node Type"] != "Seq Scan" for n in on_rows), kinds
        assert any(n.get("Index Name") == "rows_fts" for n in nodes), kinds
        read = [
            n["Actual Rows"] * n["Actual Loops"]
            + n.get("Rows Removed by Filter", 0)
            + n.get("Rows Removed by Index Recheck", 0)
            for n in on_rows
        ]
        # The other three sessions hold 3 * mine more matches: none of them is read.
        assert max(read) <= mine, (mine, read, kinds)


def test_a_huge_row_is_indexed_by_its_head_and_never_refused() -> None:
    import itertools
    import string

    alphabet = string.ascii_lowercase + string.digits
    words = ("".join(t) for t in itertools.product(alphabet, repeat=4))
    text = " ".join(itertools.islice(words, 600_000))  # 3 MB of distinct words
    with fresh_schema_url() as url, open_ledger(url) as ledger:
        ledger.create_session("s")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        body = {
            "role": "toolResult",
            "toolCallId": "c",
            "content": [{"type": "text", "text": text}],
        }
        [row] = ledger.append(fence, [NewRow.message("tool:bash", body)])
        assert ledger.row("s", row.seq) == row
        with psycopg.connect(url, autocommit=True) as conn:
            hit = f"SELECT seq FROM rows WHERE {FTS_DOCUMENT} @@ to_tsquery('simple', %s)"
            assert conn.execute(hit, ("aaab",)).fetchall() == [(1,)]
            # Without the cap the same text could not be indexed at all (and the append failed).
            with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                conn.execute("SELECT to_tsvector('simple', text) FROM rows").fetchall()


def test_concurrent_first_opens_migrate_once() -> None:
    with fresh_schema_url() as url:
        errors: list[BaseException] = []
        start = threading.Barrier(8)

        def open_one() -> None:
            try:
                start.wait()
                open_ledger(url).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version FROM tether_schema").fetchall() == [
                (SCHEMA_VERSION,)
            ]
            tables = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "ORDER BY tablename"
            ).fetchall()
        assert [t for (t,) in tables] == [
            "bridge_cursors",
            "bridge_events",
            "bridge_outbox",
            "bridge_threads",
            "erasures",
            "notes",
            "rows",
            "run_usage",
            "runs",
            "sessions",
            "tether_schema",
            "webhook_deliveries",
            "webhook_events",
        ]


def test_a_newer_schema_is_refused() -> None:
    with fresh_schema_url() as url:
        open_ledger(url).close()
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE tether_schema SET version = version + 1")
        with pytest.raises(LedgerError, match="newer than this tether"):
            open_ledger(url)


def test_a_missing_schema_is_named() -> None:
    url = f"{TEST_URL}{'&' if '?' in TEST_URL else '?'}options=-csearch_path%3Dno_such_schema_x"
    with pytest.raises(LedgerError, match="names no existing schema"):
        open_ledger(url)


def test_an_unreachable_server_is_a_ledger_error_without_the_password() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LedgerError, match="cannot reach the PostgreSQL ledger") as info:
        open_ledger(f"postgresql://u:sekrit@127.0.0.1:{port}/db?connect_timeout=3")
    assert "sekrit" not in str(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_placeholders_and_percent_signs_survive() -> None:
    assert _dialect("SELECT ? WHERE x LIKE '5%'") == "SELECT %s WHERE x LIKE '5%%'"
    with fresh_schema_url() as url, open_ledger(url) as ledger:
        ledger.create_session("100% ?")
        ledger.add_note("100% ?", "a", "50% done? %s %(x)s")
        assert ledger.notes("100% ?", "a")[0].text == "50% done? %s %(x)s"


def test_a_value_postgresql_cannot_hold_is_a_ledger_error() -> None:
    with fresh_schema_url() as url, open_ledger(url) as ledger:
        ledger.create_session("s")
        with pytest.raises(LedgerError, match="refused a value"):
            ledger.add_note("s", "a", "nul \x00 inside")
        assert ledger.notes("s", "a") == []


def test_text_sorts_by_code_point_as_on_sqlite(tmp_path: Path) -> None:
    ids = ["a-b", "aB", "a_c", "Ab", "ab", "B", "é", "z"]
    with fresh_schema_url() as url:
        orders = []
        for target in (url, f"sqlite://{tmp_path}/l.db"):
            with open_ledger(target) as ledger:
                for sid in ids:
                    ledger.create_session(sid, created="2026-11-29T10:00:00Z")
                orders.append([s.id for s in ledger.sessions()])
        assert orders == [sorted(ids), sorted(ids)]
        # Whatever the database's locale: every text column of the ledger collates as "C".
        with psycopg.connect(url) as conn:
            found = conn.execute(
                "SELECT DISTINCT c.collname FROM pg_attribute a "
                "JOIN pg_class t ON t.oid = a.attrelid "
                "JOIN pg_collation c ON c.oid = a.attcollation "
                "WHERE t.relnamespace = current_schema()::regnamespace AND a.attnum > 0 "
                "AND t.relname IN ('sessions', 'runs', 'rows', 'notes')"
            ).fetchall()
        assert found == [("C",)]
