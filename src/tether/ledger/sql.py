"""The ledger's operations, written once over a DB-API connection for both engines, composed
from one module per domain:

- :mod:`~tether.ledger.sessions`: sessions;
- :mod:`~tether.ledger.custody`: runs, the queue and custody (claims, leases, fenced ends);
- :mod:`~tether.ledger.rows`: fenced appends and the bounded reads of rows;
- :mod:`~tether.ledger.notes`: notes;
- :mod:`~tether.ledger.search`: full-text search (the one statement that differs by engine);
- :mod:`~tether.ledger.imports`: interchange import and copy;
- :mod:`~tether.ledger.lifecycle`: erasure, its receipts, and the idle sessions retention erases;
- :mod:`~tether.ledger.erasing`: a session being erased, and the stop asked of its live run;
- :mod:`~tether.ledger.limits`: what one actor may ask for, counted (the service's limits);
- :mod:`~tether.ledger.bridges`: chat threads as sessions, and the bridges' outbox.

They stand on :mod:`~tether.ledger.base` (the engine's part, fencing) and
:mod:`~tether.ledger.codec` (columns and records). The engines (:mod:`~tether.ledger.sqlite`,
:mod:`~tether.ledger.postgres`) supply connections, error translation and their DDL
(:mod:`tether.ledger.ddl`). Callers depend on the roles of :mod:`tether.ledger.roles`, not on
this class.
"""

from __future__ import annotations

from tether.ledger.base import Engine
from tether.ledger.bridges import BridgeSql
from tether.ledger.codec import ROW_COLUMNS, Cursor, encode_row
from tether.ledger.custody import CustodySql
from tether.ledger.erasing import ErasingSql
from tether.ledger.imports import DuplicateEntry, Importer, ImportSql
from tether.ledger.lifecycle import LifecycleSql
from tether.ledger.limits import LimitsSql
from tether.ledger.notes import NotesSql
from tether.ledger.rows import RowsSql
from tether.ledger.search import MAX_SEARCH_WORDS, SearchSql

__all__ = [
    "MAX_SEARCH_WORDS",
    "ROW_COLUMNS",
    "Cursor",
    "DuplicateEntry",
    "Engine",
    "Importer",
    "SqlLedger",
    "encode_row",
]


class SqlLedger(
    CustodySql,
    RowsSql,
    NotesSql,
    SearchSql,
    ImportSql,
    LifecycleSql,
    ErasingSql,
    LimitsSql,
    BridgeSql,  # chat bridges (docs/bridges.md)
):
    """The run ledger on a SQL engine: every domain's operations. Open one with
    :func:`tether.ledger.open_ledger`."""
