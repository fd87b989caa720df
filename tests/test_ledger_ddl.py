"""Each engine's DDL is in one place (``tether.ledger.ddl``): a new ledger is created from its
``SCHEMA``, an older one is migrated. The migrations replayed from an empty database must give
exactly that schema, table by table, column by column, index by index; otherwise a ledger created
by this version and one migrated to it would differ."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from pg import fresh_schema_url
from tether.ledger import open_ledger
from tether.ledger.ddl import postgres as pg_ddl
from tether.ledger.ddl import sqlite as sqlite_ddl
from tether.ledger.sqlite import _statements

Catalog = set[tuple[object, ...]]


def _normal(sql: str | None) -> str:
    """SQLite keeps each object's SQL as written (an added column spliced in): compare it
    without the layout."""
    sql = re.sub(r"\s+", " ", sql or "")
    return re.sub(r"\s*([(),])\s*", r"\1", sql).strip()


def _sqlite_catalog(conn: sqlite3.Connection) -> Catalog:
    return {
        (kind, name, table, _normal(sql))
        for kind, name, table, sql in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
        )
    }


def _sqlite_applied(scripts: Sequence[str]) -> Catalog:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for script in scripts:
            for statement in _statements(script):
                conn.execute(statement)
        return _sqlite_catalog(conn)
    finally:
        conn.close()


def test_sqlite_migrations_give_the_schema() -> None:
    migrated = _sqlite_applied(sqlite_ddl.MIGRATIONS)
    assert migrated == _sqlite_applied([sqlite_ddl.SCHEMA])
    # The comparison sees a missing step: without the last migration the schemas differ.
    assert _sqlite_applied(sqlite_ddl.MIGRATIONS[:-1]) != migrated


def test_a_new_sqlite_ledger_has_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    open_ledger(f"sqlite://{path}").close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_ddl.SCHEMA_VERSION
        assert _sqlite_catalog(conn) == _sqlite_applied(sqlite_ddl.MIGRATIONS)
    finally:
        conn.close()


def _pg_catalog(conn: psycopg.Connection[tuple[object, ...]]) -> Catalog:
    columns = conn.execute(
        "SELECT 'column', table_name, ordinal_position, column_name, data_type, is_nullable, "
        "column_default, collation_name, is_identity, identity_generation "
        "FROM information_schema.columns WHERE table_schema = current_schema()"
    ).fetchall()
    indexes = conn.execute(
        "SELECT 'index', indexname, replace(indexdef, current_schema() || '.', '') "
        "FROM pg_indexes WHERE schemaname = current_schema()"
    ).fetchall()
    constraints = conn.execute(
        "SELECT 'constraint', conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
        "FROM pg_constraint WHERE connamespace = current_schema()::regnamespace"
    ).fetchall()
    return {*columns, *indexes, *constraints}


def _pg_applied(scripts: Sequence[str]) -> Catalog:
    with fresh_schema_url() as url, psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            for script in scripts:
                conn.execute(script)
        return _pg_catalog(conn)


def test_postgres_migrations_give_the_schema() -> None:
    migrated = _pg_applied(pg_ddl.MIGRATIONS)
    assert migrated == _pg_applied([pg_ddl.SCHEMA])
    assert _pg_applied(pg_ddl.MIGRATIONS[:-1]) != migrated


def test_a_new_postgres_ledger_has_the_schema() -> None:
    with fresh_schema_url() as url:
        open_ledger(url).close()
        with psycopg.connect(url, autocommit=True) as conn:
            version = conn.execute("SELECT version FROM tether_schema").fetchall()
            catalog = _pg_catalog(conn)
    assert version == [(pg_ddl.SCHEMA_VERSION,)]
    version_table = {c for c in catalog if c[:2] == ("column", "tether_schema")}
    assert catalog - version_table == _pg_applied(pg_ddl.MIGRATIONS)


def test_sqlite_rows_stay_unique_by_session_and_seq_through_their_key(tmp_path: Path) -> None:
    # Schema 11 keys rows by FTS_KEY_SPAN * session number + seq; no index of its own keeps
    # (session, seq) unique any more: the key and its checks must.
    from tether.ledger import NewRow
    from tether.ledger.codec import encode_row

    with open_ledger(f"sqlite://{tmp_path}/l.db") as ledger:
        ledger.create_session("s")
        ledger.create_session("t")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        ledger.append(fence, [NewRow.message("user:ana", {"role": "user", "content": "hi"})])
        conn: sqlite3.Connection = ledger._conn  # type: ignore[attr-defined]
        row = encode_row("s", 1, fence.run, NewRow.message("user:ana", {"role": "user"}))
        with (
            pytest.raises(sqlite3.IntegrityError, match="UNIQUE"),
            ledger._tx() as c,  # type: ignore[attr-defined]
        ):
            ledger._insert_rows(c, [row])  # type: ignore[attr-defined]
        (num,) = conn.execute("SELECT num FROM sessions WHERE id = 't'").fetchone()
        cols = "session, seq, run, actor, kind, body, sources, bytes, media_bytes, entry_id, extra"
        for key, seq in ((num * sqlite_ddl.FTS_KEY_SPAN + 2, 1), (None, 1)):
            with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
                conn.execute(
                    f"INSERT INTO rows ({cols}, text, fts_key) "
                    "VALUES ('s', ?, NULL, 'a', 'message', '{}', '[]', 2, 0, NULL, '{}', '', ?)",
                    (seq, key),
                )
        assert conn.execute("SELECT count(*) FROM rows").fetchone() == (1,)
