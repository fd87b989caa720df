"""The run ledger: sessions, runs, rows, notes and receipts, with fenced step writes.

ledger = open_ledger("sqlite:///var/lib/tether/ledger.db")   # or "postgresql://…", "memory:"

``Ledger`` is a protocol, the union of the roles in :mod:`tether.ledger.roles`; a caller that
needs less names the role it needs.
"""

from __future__ import annotations

from tether.errors import BadLedgerUrl, LedgerError
from tether.ledger.models import (
    ENDED_STATUSES,
    Fence,
    Lease,
    NewRow,
    Note,
    ReceiptReason,
    Row,
    RowKind,
    RowSize,
    Run,
    RunStatus,
    SearchHit,
    Session,
    TailRead,
)
from tether.ledger.roles import Ledger

__all__ = [
    "ENDED_STATUSES",
    "Fence",
    "Lease",
    "Ledger",
    "NewRow",
    "Note",
    "ReceiptReason",
    "Row",
    "RowKind",
    "RowSize",
    "Run",
    "RunStatus",
    "SearchHit",
    "Session",
    "TailRead",
    "open_ledger",
]


def open_ledger(url: str) -> Ledger:
    """Open (and migrate) the ledger at ``url``: ``memory:``, ``sqlite:///PATH`` or
    ``postgresql://…``."""
    if url == "memory:" or url.startswith("sqlite:"):
        from tether.ledger.sqlite import SQLiteLedger

        return SQLiteLedger(url)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from tether.ledger.postgres import PostgresLedger  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            if exc.name is None or not exc.name.startswith("psycopg"):
                raise
            raise LedgerError(
                f"a postgresql:// ledger needs psycopg ({exc.name} is not installed): "
                "pip install 'tether[postgres]'"
            ) from exc

        ledger: Ledger = PostgresLedger(url)
        return ledger
    raise BadLedgerUrl(
        f"unknown ledger URL {url!r}: use memory:, sqlite:///PATH or postgresql://USER@HOST/DB"
    )
