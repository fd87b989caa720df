"""The test PostgreSQL: one fresh schema per test, so concurrent runs never see each other.

The server is ``TETHER_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
When it is unreachable the tests that need it fail (never skip) with a way to start one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

__all__ = [
    "TEST_URL",
    "drop_schema",
    "fresh_schema_url",
    "new_schema",
    "postgres_url",
    "schema_url",
]

TEST_URL = os.environ.get("TETHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

# Schemas made by postgres_url for the shared `ledger` fixture, dropped when the worker exits.
_made: list[str] = []


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(TEST_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL at TETHER_TEST_POSTGRES_URL={TEST_URL} is unreachable: {exc}\n"
            "Start one (on Debian: pg_ctlcluster --skip-systemctl-redirect "
            "$(ls /etc/postgresql) main start), or point TETHER_TEST_POSTGRES_URL at a server "
            "where the user may create schemas.",
            pytrace=False,
        )


def schema_url(schema: str) -> str:
    """The test server's URL with ``search_path`` set to ``schema``."""
    sep = "&" if "?" in TEST_URL else "?"
    return f"{TEST_URL}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def new_schema() -> str:
    name = f"t_{uuid.uuid4().hex[:16]}"
    with _admin() as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return name


def drop_schema(schema: str) -> None:
    with _admin() as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@contextlib.contextmanager
def fresh_schema_url() -> Iterator[str]:
    """A URL whose tables live in a new, empty schema, dropped afterwards."""
    schema = new_schema()
    try:
        yield schema_url(schema)
    finally:
        drop_schema(schema)


@contextlib.contextmanager
def engine_url(engine: str, tmp: Path) -> Iterator[str]:
    """A ledger URL of ``engine``: a fresh PostgreSQL schema, or a SQLite file in ``tmp``."""
    if engine == "postgres":
        with fresh_schema_url() as url:
            yield url
    else:
        yield f"sqlite://{tmp}/ledger.db"


def postgres_url(tmp: Path) -> str:
    """The conformance suite's factory (``BACKENDS["postgres"]``): a new schema per test."""
    schema = new_schema()
    _made.append(schema)
    return schema_url(schema)


@atexit.register
def _drop_made() -> None:
    if not _made:
        return
    with contextlib.suppress(psycopg.Error), psycopg.connect(TEST_URL, autocommit=True) as conn:
        for schema in _made:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
