"""Shared fixtures: a ledger per backend, so one conformance suite runs on every one of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pg import postgres_url
from provider import scripted_provider  # noqa: F401  (fixture; tests/provider.py)
from tether.ledger import Ledger, open_ledger

# Each backend: a factory from a fresh temporary directory to a ledger URL. The PostgreSQL
# backend (a schema per test) is tests/pg.py.
BACKENDS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: "memory:",
    "sqlite": lambda tmp: f"sqlite://{tmp}/ledger.db",
    "postgres": postgres_url,
}


@pytest.fixture(params=sorted(BACKENDS))
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return BACKENDS[request.param](tmp_path)


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    store = open_ledger(ledger_url)
    try:
        yield store
    finally:
        store.close()
