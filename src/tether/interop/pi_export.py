"""A ledger session as a pi session file (format v3) that pi opens and continues.

The rows become one parent chain in seq order (pi's format, :mod:`tether.pi.sessionformat`,
read backwards, with what the import kept in :mod:`tether.interop.pi_format`), so the file's
active branch is the whole session and pi's context for it is what the ledger holds: the newest
compaction's summary, then the rows from its first kept entry.
Entry ids are the rows' pi entry ids (new 8-hex ids for rows that have none), so an export of an
imported session gives back the entries it came from.

A compaction's ``firstKeptEntryId`` is the one it was imported with when that entry is written
before it; otherwise the entry of the first row after ``covers_to`` (its own id when it covers
every row before it: pi then keeps none).

pi has no place for run records, row actors and sources, or notes: the report counts them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import IO, Any

from tether.interop.pi_format import AFTER_KEY, BEFORE_KEY, HEADER_KEY, PI_KEY
from tether.ledger import Ledger, Row, RowKind
from tether.pi.sessionformat import (
    SESSION_VERSION,
    compaction_entry,
    iso_of_ms,
    message_entry,
    new_entry_id,
    receipt_entry,
)

__all__ = ["ExportReport", "export_pi"]


@dataclass(frozen=True)
class ExportReport:
    session: str
    entries: int
    rows: int
    runs: int
    """Run records: pi has none; a later import makes runs again from the user messages."""
    rows_with_sources: int
    """Rows whose source obligations the file cannot carry."""
    notes: int
    """Notes, which the file cannot carry."""

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "entries": self.entries,
            "rows": self.rows,
            "left_out": {
                "runs": self.runs,
                "rows_with_sources": self.rows_with_sources,
                "notes": self.notes,
            },
        }


class _Ids:
    def __init__(self) -> None:
        self.taken: set[str] = set()

    def take(self, wanted: Any) -> str:
        if isinstance(wanted, str) and wanted and wanted not in self.taken:
            self.taken.add(wanted)
            return wanted
        return new_entry_id(self.taken)


def _entry(row: Row, eid: str, parent: str | None, first_kept: str) -> dict[str, Any]:
    rest = row.extra.get(PI_KEY)
    rest = rest if isinstance(rest, dict) else {}
    head: dict[str, Any] = {"id": eid, "parentId": parent}
    stamp_ms = row.body.get("timestamp") if row.kind is RowKind.MESSAGE else None
    if "timestamp" not in rest:
        head["timestamp"] = iso_of_ms(stamp_ms)
    stamp = rest.get("timestamp", head.get("timestamp"))
    if row.kind is RowKind.COMPACTION:
        out = compaction_entry(row.body, first_kept)
    elif row.kind is RowKind.RECEIPT:
        out = receipt_entry(row.body)
    else:
        out = message_entry(row.body, stamp)
    return {"type": out["type"], **head, **rest, **out}


def export_pi(
    ledger: Ledger, session_id: str, out: IO[str], *, cwd: str | None = None
) -> ExportReport:
    """Write the session as a pi session file to ``out``; ``cwd`` is the header's working
    directory for a session that was not imported from pi (default: the current one)."""
    import os

    session = ledger.get_session(session_id)
    ids = _Ids()
    header_extra = session.extra.get(HEADER_KEY)
    header: dict[str, Any] = {"type": "session", "version": SESSION_VERSION}
    if isinstance(header_extra, dict):
        header.update({k: v for k, v in header_extra.items() if k not in ("type", "version")})
    header.setdefault("id", str(uuid.uuid4()))
    header.setdefault("timestamp", session.created)
    header.setdefault("cwd", cwd or os.getcwd())
    entries = 0

    def emit(entry: dict[str, Any]) -> None:
        nonlocal entries
        out.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")
        entries += 1

    emit(header)
    entries = 0
    parent: str | None = None
    row_ids: dict[int, str] = {}
    rows = with_sources = 0

    def bookkeeping(items: Any) -> None:
        nonlocal parent
        if not isinstance(items, list):
            return
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("type"), str):
                eid = ids.take(item.get("id"))
                emit({**item, "id": eid, "parentId": parent})
                parent = eid

    for row in ledger.iter_rows(session_id):
        rows += 1
        with_sources += bool(row.sources)
        bookkeeping(row.extra.get(BEFORE_KEY))
        eid = ids.take(row.entry_id)
        row_ids[row.seq] = eid
        first_kept = eid
        if row.kind is RowKind.COMPACTION:
            wanted = row.body.get("first_kept_entry_id")
            covers = row.covers_to or 0
            if isinstance(wanted, str) and wanted in ids.taken:
                first_kept = wanted
            elif covers + 1 < row.seq and covers + 1 in row_ids:
                first_kept = row_ids[covers + 1]
        emit(_entry(row, eid, parent, first_kept))
        parent = eid
    bookkeeping(session.extra.get(AFTER_KEY))
    return ExportReport(
        session=session_id,
        entries=entries,
        rows=rows,
        runs=len(ledger.runs(session_id)),
        rows_with_sources=with_sources,
        notes=len(ledger.all_notes(session_id)),
    )
