"""Recall's reads are bounded by the session and the answer, not by the ledger: a search reads its
own session's part of the full-text index (other sessions' matches add no work and change no
answer), a range read takes the bodies of the rows it may show and no more, and ledgers written
before the session-scoped index are migrated to it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tether.ledger.codec as ledger_codec
from followup_sessions import RunWriter
from pg import fresh_schema_url
from tether.ledger import Ledger, NewRow, Row, RowKind, Run, RunStatus, Session, open_ledger
from tether.ledger.codec import encode_row
from tether.recall import read_range, search

WORD = "crowdword"
_LAST_SEQS = (
    "UPDATE sessions SET last_seq = (SELECT max(seq) FROM rows WHERE rows.session = sessions.id)"
)


def _rows(session: str, n: int, every: int) -> Iterator[Row]:
    """``n`` rows of ``session``; every ``every``-th holds WORD, 1-3 times, so ranks differ."""
    for seq in range(1, n + 1):
        text = f"row {seq} of {session} " + " ".join(f"w{(seq * 7 + k) % 101}" for k in range(8))
        if seq % every == 0:
            text += f" {WORD}" * (1 + seq % 3)
        body = {"role": "user", "content": [{"type": "text", "text": text}]}
        yield Row(session, seq, f"r-{session}", "user:x", RowKind.MESSAGE, body, (), 0)


def fill(ledger: Ledger, session: str, n: int, every: int) -> None:
    ledger.import_records(
        [Session(session, "2026-12-01T00:00:00Z")],
        [Run(f"r-{session}", session, "a", RunStatus.FINISHED)],
        _rows(session, n, every),
        [],
    )


def found(ledger: Ledger, session: str) -> list[tuple[int, str]]:
    return [(h.row.seq, h.snippet) for h in ledger.search(session, [WORD], limit=200)]


def test_other_sessions_matches_change_no_search(ledger: Ledger) -> None:
    fill(ledger, "s", 300, 10)
    before = found(ledger, "s")
    answer = search(ledger, "s", WORD, actor=None, grants={}).to_json()
    assert len(before) == 30
    for i in range(4):
        fill(ledger, f"other{i}", 500, 1)
    assert found(ledger, "s") == before
    assert search(ledger, "s", WORD, actor=None, grants={}).to_json() == answer


def _steps(ledger: Ledger, session: str) -> int:
    """SQLite virtual-machine steps (in tens) that one search of ``session`` takes."""
    conn: sqlite3.Connection = ledger._conn  # type: ignore[attr-defined]
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 10)
    try:
        ledger.search(session, [WORD], limit=32)
    finally:
        conn.set_progress_handler(None, 0)
    return steps


def test_other_sessions_matches_add_no_work_to_a_sqlite_search(tmp_path: Path) -> None:
    with open_ledger(f"sqlite://{tmp_path}/l.db") as ledger:
        fill(ledger, "s", 300, 10)  # 30 matches
        alone = _steps(ledger, "s")
        for i in range(4):
            fill(ledger, f"other{i}", 1000, 1)  # 4,000 matches elsewhere
        crowded = _steps(ledger, "s")
    # Before the session-scoped index every match of every session was joined, ranked and
    # sorted: about 20 times the steps here.
    assert crowded <= 1.5 * alone + 10, (alone, crowded)


def test_a_search_reads_the_sqlite_index_by_session_range(tmp_path: Path) -> None:
    with open_ledger(f"sqlite://{tmp_path}/l.db") as ledger:
        fill(ledger, "s", 20, 2)
        sql, params = ledger._search_query([WORD], "s", (1, 2**62), 8, 0, 400)  # type: ignore[attr-defined]
        plan = [r[3] for r in ledger._conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]  # type: ignore[attr-defined]
    fts = [p for p in plan if "rows_fts VIRTUAL TABLE" in p]
    # FTS5's plan names its constraints: M (the match), > and < (the rowid range).
    assert fts, plan
    constraints = fts[0].split(":")[-1]
    assert ">" in constraints, plan
    assert "<" in constraints, plan


def _count_bodies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seqs of the rows the ledger reads whole (decodes), as they are read."""
    seen: list[int] = []
    real = ledger_codec.row_of

    def counting(r: Any) -> Row:
        seen.append(r[1])
        return real(r)

    monkeypatch.setattr(ledger_codec, "row_of", counting)
    return seen


def test_a_range_reads_the_rows_it_shows_and_one_more(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = RunWriter.start(ledger, "s1", "rev")
    w.request("Rows of every size")
    for i in range(100):
        w.say(f"big {i} " + "x" * 20_000)
    for i in range(100):
        w.say(f"small {i} " + "y" * 700)
    for i in range(100):
        w.say(f"private {i} " + "z" * 20_000, sources=("repo:acme/keys",))
    w.say("last")
    w.end()
    seen = _count_bodies(monkeypatch)

    big = read_range(ledger, "s1", 2, 101, actor=None, grants={})
    assert [r.seq for r in big.rows] == [2]
    assert big.rows[0].truncated
    assert big.next == 3
    assert seen == [2]  # before: all 100 rows of 20 KB

    seen.clear()
    small = read_range(ledger, "s1", 102, 201, actor=None, grants={})
    assert small.next is not None
    assert len(small.rows) > 10
    assert len(seen) <= len(small.rows) + 2, (len(seen), len(small.rows))

    seen.clear()  # withheld rows are named from their sources, never read whole
    grants = {"user:bob": ["repo:other/*"]}
    hidden = read_range(ledger, "s1", 202, 302, actor="user:bob", grants=grants)
    assert hidden.withheld == ((202, 301),)
    assert [r.seq for r in hidden.rows] == [302]
    assert seen == [302]


def test_sqlite_reads_row_sizes_and_sources_from_an_index(tmp_path: Path) -> None:
    # The sources are stored after the body: read from the table, they cost a big body's pages.
    with open_ledger(f"sqlite://{tmp_path}/l.db") as ledger:
        fill(ledger, "s", 20, 2)
        seen: list[str] = []
        conn: sqlite3.Connection = ledger._conn  # type: ignore[attr-defined]
        conn.set_trace_callback(seen.append)
        try:
            assert [r.seq for r in ledger.row_sizes("s", 3, 9)] == list(range(3, 10))
        finally:
            conn.set_trace_callback(None)
        [sql] = [q for q in seen if "sources" in q]
        plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
    assert any("COVERING INDEX rows_heads" in p for p in plan), plan


# -- ledgers written before the session-scoped index --------------------------------------------


def _old_rows() -> list[tuple[Any, ...]]:
    """Rows as tether wrote them (encode_row), for sessions a and b: b's rows all match."""
    out = []
    for session, n, every in (("a", 40, 4), ("b", 60, 1)):
        for row in _rows(session, n, every):
            new = NewRow(row.actor, row.kind, row.body)
            out.append(encode_row(session, row.seq, f"r-{session}", new))
    return out


def _answers_as_fresh(ledger: Ledger, fresh: Ledger) -> None:
    """A migrated ledger answers like a fresh one holding the same rows, and keys the sessions
    and rows written after the migration too."""
    fill(fresh, "a", 40, 4)
    fill(fresh, "b", 60, 1)
    assert sorted(seq for seq, _ in found(ledger, "a")) == [4 * i for i in range(1, 11)]
    assert found(ledger, "a") == found(fresh, "a")
    assert found(ledger, "b") == found(fresh, "b")
    fill(ledger, "c", 10, 5)
    assert sorted(seq for seq, _ in found(ledger, "c")) == [5, 10]
    assert found(ledger, "a") == found(fresh, "a")


def test_a_schema_6_sqlite_ledger_is_migrated(tmp_path: Path) -> None:
    from tether.ledger.sqlite import MIGRATIONS, SCHEMA_VERSION, _statements

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    for script in MIGRATIONS[:6]:
        for statement in _statements(script):
            conn.execute(statement)
    for s in ("a", "b"):
        conn.execute("INSERT INTO sessions (id, created, last_seq) VALUES (?, ?, ?)", (s, "t", 0))
        conn.execute(
            "INSERT INTO runs (id, session, agent, status) VALUES (?, ?, 'x', 'finished')",
            (f"r-{s}", s),
        )
    conn.executemany(ledger_codec.INSERT_ROW, _old_rows())
    conn.execute(_LAST_SEQS)
    conn.execute("PRAGMA user_version = 6")
    conn.close()

    with open_ledger(f"sqlite://{db}") as ledger, open_ledger("memory:") as fresh:
        assert ledger._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # type: ignore[attr-defined]
        keys = "SELECT count(*) FROM rows WHERE fts_key IS NULL OR fts_key % 4294967296 != seq"
        assert ledger._conn.execute(keys).fetchone() == (0,)  # type: ignore[attr-defined]
        _answers_as_fresh(ledger, fresh)


def test_a_schema_6_postgres_ledger_is_migrated() -> None:
    from tether.ledger.postgres import MIGRATIONS, SCHEMA_VERSION, _dialect

    with fresh_schema_url() as url:
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            for script in MIGRATIONS[:6]:
                conn.execute(script)
            conn.execute("CREATE TABLE tether_schema (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO tether_schema (version) VALUES (6)")
            for s in ("a", "b"):
                conn.execute(
                    "INSERT INTO sessions (id, created, last_seq) VALUES (%s, 't', 0)", (s,)
                )
                conn.execute(
                    "INSERT INTO runs (id, session, agent, status) "
                    "VALUES (%s, %s, 'x', 'finished')",
                    (f"r-{s}", s),
                )
            with conn.cursor() as cur:
                cur.executemany(_dialect(ledger_codec.INSERT_ROW), _old_rows())
            conn.execute(_LAST_SEQS)
        with open_ledger(url) as ledger, fresh_schema_url() as other, open_ledger(other) as fresh:
            with psycopg.connect(url, autocommit=True) as conn:
                assert conn.execute("SELECT version FROM tether_schema").fetchall() == [
                    (SCHEMA_VERSION,)
                ]
                [[index]] = conn.execute(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = 'rows_fts' "
                    "AND schemaname = current_schema()"
                ).fetchall()
            assert "md5(session)" in index
            _answers_as_fresh(ledger, fresh)
