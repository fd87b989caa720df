"""How the ledger's records are stored: the columns each read selects, a stored row's encoding,
and the decoding of what a read returns (shared by every domain module and both engines).

Every decoder is called through this module (``codec.row_of``), so a test can count what the
ledger reads whole by patching it here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from tether.errors import StorageError
from tether.ledger.models import (
    ENDED_STATUSES,
    Lease,
    NewRow,
    Note,
    Row,
    RowKind,
    RowSize,
    Run,
    RunStatus,
)
from tether.ledger.text import row_text
from tether.sizes import canonical_json, measure

__all__ = [
    "ENDED_IN",
    "INSERT_ROW",
    "NOTE_COLS",
    "ROW_COLS",
    "ROW_COLUMNS",
    "RUN_COLS",
    "Cursor",
    "encode_row",
    "lease_of",
    "loads_extra",
    "note_of",
    "row_of",
    "run_of",
    "size_of",
]

ROW_COLUMNS = (
    "session",
    "seq",
    "run",
    "actor",
    "kind",
    "body",
    "sources",
    "bytes",
    "media_bytes",
    "entry_id",
    "extra",
)
ROW_COLS = ", ".join(ROW_COLUMNS)
NOTE_COLS = "agent, text, at, extra, actor, run, sources"
RUN_COLS = "id, session, agent, status, request_seq, started, ended, epoch, extra"
ENDED_IN = "(" + ", ".join(f"'{s.value}'" for s in sorted(ENDED_STATUSES)) + ")"


class Cursor(Protocol):
    """The part of a DB-API cursor the ledger uses (sqlite3 and psycopg both have it)."""

    @property
    def rowcount(self) -> int: ...
    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...
    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


def loads_extra(text: str | None) -> dict[str, Any]:
    if not text or text == "{}":
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StorageError(
            f"the ledger holds a corrupt record: an 'extra' field is not JSON ({exc}); "
            "restore the ledger from a backup"
        ) from exc
    if not isinstance(value, dict):
        raise StorageError("the ledger holds a corrupt record: an 'extra' field is not an object")
    return value


def row_of(r: Sequence[Any]) -> Row:
    try:
        body = json.loads(r[5])
        sources = tuple(json.loads(r[6])) if r[6] != "[]" else ()
        kind = RowKind(r[4])
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
    except (ValueError, TypeError, RecursionError) as exc:
        # Rows are written only as canonical JSON: this one was changed outside tether.
        raise StorageError(
            f"row {r[1]} of session {r[0]!r} is corrupt ({exc}); it was changed outside "
            "tether: restore it from a backup or a `tether ledger dump`"
        ) from exc
    return Row(
        session=r[0],
        seq=r[1],
        run=r[2],
        actor=r[3],
        kind=kind,
        body=body,
        sources=sources,
        bytes=r[7],
        media_bytes=r[8],
        entry_id=r[9],
        extra=loads_extra(r[10]),
    )


def size_of(session_id: str, seq: int, size: int, sources: str) -> RowSize:
    if sources == "[]":
        return RowSize(seq, size, ())
    try:
        return RowSize(seq, size, tuple(json.loads(sources)))
    except (ValueError, TypeError, RecursionError) as exc:
        raise StorageError(
            f"row {seq} of session {session_id!r} is corrupt ({exc}); it was changed outside "
            "tether: restore it from a backup or a `tether ledger dump`"
        ) from exc


def note_of(session_id: str, r: Sequence[Any]) -> Note:
    return Note(
        session=session_id,
        agent=r[0],
        text=r[1],
        at=r[2],
        extra=loads_extra(r[3]),
        actor=r[4],
        run=r[5],
        sources=tuple(json.loads(r[6])) if r[6] != "[]" else (),
    )


def run_of(r: Sequence[Any]) -> Run:
    return Run(
        id=r[0],
        session=r[1],
        agent=r[2],
        status=RunStatus(r[3]),
        request_seq=r[4],
        started=r[5],
        ended=r[6],
        epoch=r[7],
        extra=loads_extra(r[8]),
    )


def lease_of(r: Sequence[Any]) -> Lease:
    return Lease(
        run=r[0],
        session=r[1],
        epoch=int(r[2]),
        owner=r[3],
        expires=float(r[4]) if r[4] is not None else None,
        placement=json.loads(r[5]) if r[5] else None,
    )


def encode_row(session: str, seq: int, run: str | None, row: NewRow) -> tuple[Any, ...]:
    """The stored tuple of a row: its body as canonical JSON, measured once, here."""
    body = canonical_json(row.body)
    m = measure(row.body, canonical=body)
    return (
        session,
        seq,
        run,
        row.actor,
        row.kind.value,
        body,
        canonical_json(list(row.sources)) if row.sources else "[]",
        m.text_bytes,
        m.media_bytes,
        row.entry_id,
        canonical_json(row.extra) if row.extra else "{}",
        row_text(row.kind, row.body),
    )


INSERT_ROW = (
    "INSERT INTO rows (session, seq, run, actor, kind, body, sources, bytes, media_bytes, "
    "entry_id, extra, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
