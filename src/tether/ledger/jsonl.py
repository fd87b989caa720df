"""The ledger interchange format (DESIGN §3.1): one JSON object per line.

``load`` parses and checks a whole file before anything is written, then writes it in one
transaction: a bad file writes nothing, and the error names the file, the line and the problem.
``dump`` writes a session back; fields this version does not know ride along in ``extra``, so a
round trip keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tether.errors import InterchangeError
from tether.ledger.models import Note, Row, RowKind, Run, RunStatus, Session
from tether.ledger.sql import SqlLedger

__all__ = ["LoadReport", "dump_session", "load_file", "load_lines", "parse_lines"]

_SESSION_KEYS = {"type", "id", "created", "refusing"}
_RUN_KEYS = {"type", "id", "session", "agent", "status", "request_seq", "started", "ended", "epoch"}
_ROW_KEYS = {"type", "session", "seq", "run", "actor", "sources", "entry", *RowKind}
_NOTE_KEYS = {"type", "session", "agent", "text", "at", "actor", "run", "sources"}


@dataclass
class Parsed:
    sessions: list[Session] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


@dataclass(frozen=True)
class LoadReport:
    sessions: int
    runs: int
    rows: int
    notes: int


def _extra(obj: dict[str, Any], known: set[str]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in known}


def _str(obj: dict[str, Any], key: str, fail: Any, *, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        fail(f"field {key!r} must be a non-empty string")
    return value


def _check_message(msg: Any, fail: Any) -> None:
    if not isinstance(msg, dict):
        fail("'message' must be an object (a pi AgentMessage)")
    role = msg.get("role")
    if not isinstance(role, str):
        fail("message has no 'role'")
    if role == "toolResult" and not isinstance(msg.get("toolCallId"), str):
        fail("a toolResult message has no 'toolCallId'")
    content = msg.get("content")
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                fail("every content block must be an object with a 'type'")
            if block["type"] == "toolCall" and not isinstance(block.get("id"), str):
                fail("a toolCall block has no 'id'")


def parse_lines(lines: Iterable[bytes], source: str, ledger: SqlLedger | None = None) -> Parsed:
    """Parse and check interchange lines. With a ledger, sessions and runs it already holds may
    be referred to, and row seqs must continue its sessions densely."""
    out = Parsed()
    sessions: set[str] = set()
    runs: dict[str, str] = {}  # run id -> session
    next_seq: dict[str, int] = {}
    lineno = 0

    for lineno, raw in enumerate(lines, start=1):

        def fail(problem: str, _n: int = lineno) -> Any:
            raise InterchangeError(source, _n, problem)

        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail(f"invalid UTF-8 at byte {exc.start}")
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            fail(f"malformed JSON: {exc.msg} (column {exc.colno})")
        if not isinstance(obj, dict):
            fail("a record must be a JSON object")
        kind = obj.get("type")

        if kind == "session":
            sid = _str(obj, "id", fail)
            if sid in sessions or (ledger is not None and ledger.session(sid) is not None):
                fail(f"session {sid!r} is defined twice (or already exists in the ledger)")
            sessions.add(sid)
            next_seq[sid] = 1
            out.sessions.append(
                Session(
                    id=sid,
                    created=_str(obj, "created", fail),
                    refusing=_str(obj, "refusing", fail, optional=True),
                    extra=_extra(obj, _SESSION_KEYS),
                )
            )

        elif kind == "run":
            rid = _str(obj, "id", fail)
            sid = _str(obj, "session", fail)
            if rid in runs or (ledger is not None and ledger.run(rid) is not None):
                fail(f"run {rid!r} is defined twice (or already exists in the ledger)")
            if sid not in sessions and not _known_session(ledger, sid, next_seq):
                fail(f"run {rid!r} names unknown session {sid!r}")
            try:
                status = RunStatus(obj.get("status"))
            except ValueError:
                fail(f"run status must be one of {', '.join(s.value for s in RunStatus)}")
            request_seq = obj.get("request_seq")
            if request_seq is not None and (not isinstance(request_seq, int) or request_seq < 1):
                fail("'request_seq' must be a positive integer or null")
            epoch = obj.get("epoch", 0)
            if not isinstance(epoch, int):
                fail("'epoch' must be an integer")
            runs[rid] = sid
            out.runs.append(
                Run(
                    id=rid,
                    session=sid,
                    agent=_str(obj, "agent", fail),
                    status=status,
                    request_seq=request_seq,
                    started=_str(obj, "started", fail, optional=True),
                    ended=_str(obj, "ended", fail, optional=True),
                    epoch=epoch,
                    extra=_extra(obj, _RUN_KEYS),
                )
            )

        elif kind == "row":
            sid = _str(obj, "session", fail)
            if sid not in sessions and not _known_session(ledger, sid, next_seq):
                fail(f"row names unknown session {sid!r}")
            seq = obj.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool):
                fail("'seq' must be an integer")
            expected = next_seq[sid]
            if seq < expected:
                fail(f"duplicate seq {seq} in session {sid!r} (expected {expected})")
            if seq > expected:
                fail(f"seq {seq} in session {sid!r} is not dense (expected {expected})")
            rid = _str(obj, "run", fail, optional=True)
            if rid is not None:
                owner = runs.get(rid)
                if owner is None and ledger is not None:
                    found = ledger.run(rid)
                    owner = found.session if found else None
                if owner is None:
                    fail(f"row {seq} names unknown run {rid!r}")
                if owner != sid:
                    fail(f"row {seq} of session {sid!r} names run {rid!r} of session {owner!r}")
            present = [k for k in RowKind if k.value in obj]
            if len(present) != 1:
                fail("a row holds exactly one of 'message', 'compaction', 'receipt'")
            row_kind = present[0]
            body = obj[row_kind.value]
            if row_kind is RowKind.MESSAGE:
                _check_message(body, fail)
            elif not isinstance(body, dict):
                fail(f"'{row_kind.value}' must be an object")
            elif row_kind is RowKind.COMPACTION and not isinstance(body.get("summary"), str):
                fail("a compaction has no 'summary' string")
            elif row_kind is RowKind.RECEIPT and not isinstance(body.get("kind"), str):
                fail("a receipt has no 'kind'")
            sources = obj.get("sources", [])
            if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
                fail("'sources' must be a list of strings")
            next_seq[sid] = seq + 1
            out.rows.append(
                Row(
                    session=sid,
                    seq=seq,
                    run=rid,
                    actor=_str(obj, "actor", fail),
                    kind=row_kind,
                    body=body,
                    sources=tuple(sources),
                    bytes=0,
                    entry_id=_str(obj, "entry", fail, optional=True),
                    extra=_extra(obj, _ROW_KEYS),
                )
            )

        elif kind == "note":
            sid = _str(obj, "session", fail)
            if sid not in sessions and not _known_session(ledger, sid, next_seq):
                fail(f"note names unknown session {sid!r}")
            text_value = obj.get("text")
            if not isinstance(text_value, str):
                fail("'text' must be a string")
            note_sources = obj.get("sources", [])
            if not isinstance(note_sources, list) or not all(
                isinstance(s, str) for s in note_sources
            ):
                fail("'sources' must be a list of strings")
            out.notes.append(
                Note(
                    session=sid,
                    agent=_str(obj, "agent", fail),
                    text=text_value,
                    at=_str(obj, "at", fail),
                    extra=_extra(obj, _NOTE_KEYS),
                    actor=_str(obj, "actor", fail, optional=True),
                    run=_str(obj, "run", fail, optional=True),
                    sources=tuple(note_sources),
                )
            )
        else:
            fail(f"unknown record type {kind!r} (expected session, run, row or note)")

    for run in out.runs:
        # next_seq continues the ledger's own rows for sessions it already holds
        if run.request_seq is not None and run.request_seq >= next_seq.get(run.session, 1):
            raise InterchangeError(
                source,
                lineno,
                f"run {run.id!r} names request_seq {run.request_seq}, no such row",
            )
    return out


def _known_session(ledger: SqlLedger | None, sid: str, next_seq: dict[str, int]) -> bool:
    if sid in next_seq:
        return True
    if ledger is None or ledger.session(sid) is None:
        return False
    next_seq[sid] = ledger.last_seq(sid) + 1
    return True


def _split(data: bytes) -> Iterator[bytes]:
    # Split on b"\n" only: U+2028 and friends are legal inside JSON strings.
    for line in data.split(b"\n"):
        yield line.rstrip(b"\r")


def load_lines(ledger: SqlLedger, data: bytes, source: str = "<input>") -> LoadReport:
    parsed = parse_lines(_split(data), source, ledger)
    ledger.import_records(parsed.sessions, parsed.runs, parsed.rows, parsed.notes)
    return LoadReport(len(parsed.sessions), len(parsed.runs), len(parsed.rows), len(parsed.notes))


def load_file(ledger: SqlLedger, path: str | Path) -> LoadReport:
    """Load a JSONL file into the ledger in one transaction; a bad file writes nothing."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InterchangeError(str(p), 0, f"cannot read: {exc.strerror}") from exc
    return load_lines(ledger, data, str(p))


def session_record(s: Session) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "session", "id": s.id, "created": s.created}
    if s.refusing is not None:
        rec["refusing"] = s.refusing
    return {**s.extra, **rec}


def run_record(r: Run) -> dict[str, Any]:
    rec = {
        "type": "run",
        "id": r.id,
        "session": r.session,
        "agent": r.agent,
        "status": r.status.value,
        "request_seq": r.request_seq,
        "started": r.started,
        "ended": r.ended,
    }
    if r.epoch:
        rec["epoch"] = r.epoch
    return {**r.extra, **rec}


def row_record(row: Row) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "type": "row",
        "session": row.session,
        "seq": row.seq,
        "run": row.run,
        "actor": row.actor,
        "sources": list(row.sources),
        row.kind.value: row.body,
    }
    if row.entry_id is not None:
        rec["entry"] = row.entry_id
    return {**row.extra, **rec}


def note_record(n: Note) -> dict[str, Any]:
    return {
        **n.extra,
        "type": "note",
        "session": n.session,
        "agent": n.agent,
        "text": n.text,
        "at": n.at,
        **({"actor": n.actor} if n.actor is not None else {}),
        **({"run": n.run} if n.run is not None else {}),
        **({"sources": list(n.sources)} if n.sources else {}),
    }


def dump_session(ledger: SqlLedger, session_id: str, out: IO[str]) -> int:
    """Write one session as JSONL; returns the number of records written."""
    session = ledger.get_session(session_id)
    count = 0

    def emit(rec: dict[str, Any]) -> None:
        nonlocal count
        out.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        count += 1

    emit(session_record(session))
    for run in ledger.runs(session_id):
        emit(run_record(run))
    for row in ledger.iter_rows(session_id):
        emit(row_record(row))
    for note in ledger.all_notes(session_id):
        emit(note_record(note))
    return count
