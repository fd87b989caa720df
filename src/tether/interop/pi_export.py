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

Each ended run is written as a ``tether.run`` custom entry right after its last row
(:mod:`tether.interop.pi_format`): its status, its start and end, and the entries of its first,
last and request rows, so an import makes the same runs again, whatever user messages they hold
(a run's copy of the previous request, steering). Its entry id is derived from the entry before
it, so exporting the same session twice writes the same file. A row that has no time of its own
(a checkpoint or receipt tether wrote) is stamped with its run's end, else the entry before it.

pi has no place for a run's id, agent and the rest of its record, for runs that have not ended,
for row actors and sources, or for notes: the report counts what was left out.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import IO, Any

from tether.interop.pi_format import AFTER_KEY, BEFORE_KEY, HEADER_KEY, PI_KEY, RUN_TYPE
from tether.ledger import ENDED_STATUSES, Ledger, Row, RowKind, Run
from tether.pi.sessionformat import (
    SESSION_VERSION,
    compaction_entry,
    iso_of_ms,
    message_entry,
    ms_of_iso,
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
    """Run records written as ``tether.run`` entries (the ended runs)."""
    runs_left_out: int
    """Runs not written: those that have not ended (queued or running)."""
    rows_with_sources: int
    """Rows whose source obligations the file cannot carry."""
    notes: int
    """Notes, which the file cannot carry."""

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "entries": self.entries,
            "rows": self.rows,
            "runs": self.runs,
            "left_out": {
                "runs": self.runs_left_out,
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

    def derived(self, seed: str) -> str:
        """An 8-hex id derived from ``seed`` (the same seed, the same id), unique here."""
        for n in range(1000):
            eid = hashlib.sha256(f"{seed}\0{n}".encode()).hexdigest()[:8]
            if eid not in self.taken:
                self.taken.add(eid)
                return eid
        return new_entry_id(self.taken)


def _entry(
    row: Row, eid: str, parent: str | None, first_kept: str, fallback_ms: int | None
) -> dict[str, Any]:
    rest = row.extra.get(PI_KEY)
    rest = rest if isinstance(rest, dict) else {}
    head: dict[str, Any] = {"id": eid, "parentId": parent}
    stamp_ms = row.body.get("timestamp") if row.kind is RowKind.MESSAGE else None
    if "timestamp" not in rest:
        head["timestamp"] = iso_of_ms(stamp_ms if stamp_ms is not None else fallback_ms)
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
    last_ms = ms_of_iso(session.created)

    def bookkeeping(items: Any) -> None:
        nonlocal parent, last_ms
        if not isinstance(items, list):
            return
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("type"), str):
                eid = ids.take(item.get("id"))
                emit({**item, "id": eid, "parentId": parent})
                last_ms = ms_of_iso(item.get("timestamp")) or last_ms
                parent = eid

    runs = ledger.runs(session_id)
    ended = {r.id: r for r in runs if r.status in ENDED_STATUSES}
    spans, after = _run_places(ledger, list(ended.values()))

    def run_entries(seq: int) -> None:
        nonlocal parent, last_ms
        for run in after.get(seq, ()):
            first, last = spans.get(run.id, (None, None))
            eid = ids.derived(f"{RUN_TYPE}:{parent}")
            stamp = ms_of_iso(run.ended) or last_ms
            data = {
                "status": run.status.value,
                "started": run.started,
                "ended": run.ended,
                "first": row_ids.get(first) if first is not None else None,
                "last": row_ids.get(last) if last is not None else None,
                "request": row_ids.get(run.request_seq) if run.request_seq is not None else None,
            }
            emit(
                {
                    "type": "custom",
                    "id": eid,
                    "parentId": parent,
                    "timestamp": iso_of_ms(stamp),
                    "customType": RUN_TYPE,
                    "data": data,
                }
            )
            last_ms, parent = stamp, eid

    run_entries(0)
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
        own = ended.get(row.run) if row.run is not None else None
        fallback = (ms_of_iso(own.ended) if own is not None else None) or last_ms
        entry = _entry(row, eid, parent, first_kept, fallback)
        emit(entry)
        last_ms = ms_of_iso(entry.get("timestamp")) or last_ms
        parent = eid
        run_entries(row.seq)
    bookkeeping(session.extra.get(AFTER_KEY))
    return ExportReport(
        session=session_id,
        entries=entries,
        rows=rows,
        runs=len(ended),
        runs_left_out=len(runs) - len(ended),
        rows_with_sources=with_sources,
        notes=len(ledger.all_notes(session_id)),
    )


def _run_places(
    ledger: Ledger, runs: list[Run]
) -> tuple[dict[str, tuple[int, int]], dict[int, list[Run]]]:
    """Each run's first and last row (two index reads a run), and after which row its entry
    goes: its last, or for a run without rows the place of the run before it (0: before the
    first row)."""
    spans: dict[str, tuple[int, int]] = {}
    after: dict[int, list[Run]] = {}
    place = 0
    for run in runs:
        first = ledger.run_first_seq(run.id)
        newest = ledger.run_rows_before(run.id, 2**62, limit=1) if first is not None else []
        if first is not None and newest:
            spans[run.id] = (first, newest[0].seq)
            place = newest[0].seq
        after.setdefault(place, []).append(run)
    return spans, after
