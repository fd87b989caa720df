"""Shared fixtures (a ledger per backend, so one conformance suite runs on every one of them) and
the test tiers.

Tiers: a test that starts Node (pi) is marked ``pi``, one that needs PostgreSQL ``postgres``,
here, from what it uses (below), so that no test file has to say it. ``make test-fast`` runs the
unit tier, ``TETHER_TEST_TIER=unit`` with ``-m "not slow and not pi and not postgres"``; in that
tier pi and the database are made unreachable (``TETHER_PI`` names no file, the PostgreSQL URL a
closed port), so a test that needs them and was not marked fails there instead of passing by
luck; property tests run fewer examples there (``tests/support/tier.py``). ``make test`` runs
every tier at full size.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import pg
from pg import postgres_url
from provider import scripted_provider  # noqa: F401  (fixture; tests/provider.py)
from support.synapse import homeserver, people  # noqa: F401  (fixtures: one Synapse a session)
from support.tier import UNIT_TIER
from tether.harness.run import execute_run
from tether.ledger import Ledger, open_ledger
from tether.pi.install import find_pi
from tether.pi.launch import PiLaunch

if UNIT_TIER:
    os.environ["TETHER_PI"] = "/nonexistent/the-unit-tier-starts-no-pi/cli.js"
    os.environ["TETHER_NODE"] = "/nonexistent/the-unit-tier-starts-no-node"
    os.environ["TETHER_TEST_POSTGRES_URL"] = "postgresql://postgres@127.0.0.1:9/no-postgres-in-unit"
    pg.TEST_URL = os.environ["TETHER_TEST_POSTGRES_URL"]  # test modules import it after this

# Each backend: a factory from a fresh temporary directory to a ledger URL. The PostgreSQL
# backend (a schema per test) is tests/pg.py.
BACKENDS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: "memory:",
    "sqlite": lambda tmp: f"sqlite://{tmp}/ledger.db",
    "postgres": postgres_url,
}

STARTS_PI = (find_pi, PiLaunch, execute_run)
"""A test module that imports one of these starts pi (or needs Node): all its tests are ``pi``."""
PI_FIXTURES = frozenset({"scripted_provider"})
"""A test that uses one of these talks to pi (the scripted provider is pi's model server) …"""
PROVIDER_ALONE = frozenset({"test_provider.py"})
"""… except in these modules, which test the provider itself."""
PG_NAMES = tuple(getattr(pg, name) for name in pg.__all__)
"""A test module that imports one of these (tests/pg.py) uses PostgreSQL, in every test that is
not parametrized to another backend."""


def _imports(module: ModuleType | None, objects: tuple[object, ...]) -> bool:
    return module is not None and any(
        value is obj for value in vars(module).values() for obj in objects
    )


def tiers(item: pytest.Item) -> set[str]:
    """The tier markers of ``item`` (``pi``, ``postgres``), from what it uses."""
    found: set[str] = set()
    module = getattr(item, "module", None)
    fixtures = set(getattr(item, "fixturenames", ()))
    if _imports(module, STARTS_PI) or (
        fixtures & PI_FIXTURES and item.path.name not in PROVIDER_ALONE
    ):
        found.add("pi")
    callspec = getattr(item, "callspec", None)
    ids = set(callspec.id.split("-")) if callspec is not None else set()
    if "postgres" in ids or (_imports(module, PG_NAMES) and not ids & {"memory", "sqlite"}):
        found.add("postgres")
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in tiers(item) - {m.name for m in item.iter_markers()}:
            item.add_marker(getattr(pytest.mark, name))


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
