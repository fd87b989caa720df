"""The ledger interchange format (docs/contracts.md#the-interchange-format): one JSON object per
line.

``load`` streams a file through the record schema (:mod:`tether.ledger.records`) into one
transaction: each record is checked against its line and against what came before (in the file
or the ledger), then written, so memory stays bounded whatever the file's size; the first bad
line rolls everything back, and the error names the file, the line and the problem. ``dump``
writes a session back; fields this version does not know ride along in ``extra``, so a round
trip keeps them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from pydantic import ValidationError

from tether.errors import InterchangeError, LedgerError
from tether.ledger.imports import DuplicateEntry, Importer
from tether.ledger.models import Note, Row, RowKind, Run, RunStatus, Session
from tether.ledger.records import (
    NoteRecord,
    RowRecord,
    RunRecord,
    SessionRecord,
    describe_error,
    fill_pi_defaults,
    validate_record,
)
from tether.ledger.roles import Interchange, Ledger

__all__ = [
    "MAX_DEPTH",
    "MAX_LINE_BYTES",
    "LoadReport",
    "dump_session",
    "load_file",
    "load_lines",
    "load_stream",
    "parse_lines",
]

MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest record a file may hold (pi's own RPC reader has the same bound)."""
MAX_DEPTH = 128
"""How deeply a record's JSON may nest. Deeper values are no message pi writes, and recursive
code (JSON encoders, the byte accounting) would fail on them later."""
# A JavaScript number is a double: an integer of more digits than this is Infinity to pi.
_MAX_INT_DIGITS = 308

_SESSION_KEYS = {"type", "id", "created", "refusing"}
_RUN_KEYS = {"type", "id", "session", "agent", "status", "request_seq", "started", "ended", "epoch"}
_ROW_KEYS = {"type", "session", "seq", "run", "actor", "sources", "entry", *RowKind}
_NOTE_KEYS = {"type", "session", "agent", "text", "at", "actor", "run", "sources"}
# A lone surrogate can only arrive as a \u escape (raw bytes were checked as UTF-8 already).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class LoadReport:
    sessions: int
    runs: int
    rows: int
    notes: int


class _Bad(Exception):
    """A problem with the current line (becomes an InterchangeError with its number)."""


def _reject_constant(name: str) -> NoReturn:
    raise _Bad(f"{name} is not a number pi can read (JSON numbers must be finite)")


def _parse_int(text: str) -> int:
    if len(text) - text.startswith("-") > _MAX_INT_DIGITS:
        raise _Bad(
            f"an integer of {len(text)} digits is not a finite number to pi "
            f"(at most {_MAX_INT_DIGITS} digits)"
        )
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Bad(f"{text[:40]} is not a finite number (pi would read it as Infinity)")
    return value


_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_int=_parse_int, parse_float=_parse_float
)


def _check_tree(value: Any, surrogates: bool) -> None:
    """Depth (and, when the line escapes one, lone surrogates), without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _Bad(f"the record nests deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            for key, item in node.items():
                if surrogates and _SURROGATE.search(key):
                    raise _Bad(f"key {ascii(key)[:60]} holds a lone surrogate (not Unicode text)")
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif surrogates and isinstance(item, str) and _SURROGATE.search(item):
                    raise _Bad(f"field {key!r} holds a lone surrogate (not Unicode text)")
        elif isinstance(node, list):
            for item in node:
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif surrogates and isinstance(item, str) and _SURROGATE.search(item):
                    raise _Bad("a list holds a string with a lone surrogate (not Unicode text)")


def _decode(raw: bytes) -> dict[str, Any] | None:
    """One line as a JSON object (None for a blank line), or :class:`_Bad`."""
    if len(raw) > MAX_LINE_BYTES:
        raise _Bad(f"the line is longer than {MAX_LINE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(f"invalid UTF-8 at byte {exc.start}") from None
    if not text.strip():
        return None
    try:
        obj = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise _Bad(f"malformed JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise _Bad(f"the record nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # int() of too many digits, should the hook not see it
        raise _Bad(f"a number pi cannot read: {exc}") from None
    if not isinstance(obj, dict):
        raise _Bad(f"a record must be a JSON object, not {type(obj).__name__}")
    if text.count("{") + text.count("[") > MAX_DEPTH or _SURROGATE_ESCAPE.search(text):
        _check_tree(obj, surrogates=_SURROGATE_ESCAPE.search(text) is not None)
    return obj


ParsedRecord = Session | Run | Row | Note


def _record(obj: dict[str, Any]) -> ParsedRecord:
    """The ledger record of a decoded line, checked against the schema."""
    try:
        rec = validate_record(obj)
    except ValidationError as exc:
        raise _Bad(describe_error(exc)) from None
    if isinstance(rec, SessionRecord):
        return Session(
            id=rec.id,
            created=rec.created,
            refusing=rec.refusing,
            extra=_extra(obj, _SESSION_KEYS),
        )
    if isinstance(rec, RunRecord):
        return Run(
            id=rec.id,
            session=rec.session,
            agent=rec.agent,
            status=RunStatus(rec.status),
            request_seq=rec.request_seq,
            started=rec.started,
            ended=rec.ended,
            epoch=rec.epoch,
            extra=_extra(obj, _RUN_KEYS),
        )
    if isinstance(rec, RowRecord):
        present = [k for k in RowKind if obj.get(k.value) is not None]
        if len(present) != 1:
            raise _Bad("a row holds exactly one of 'message', 'compaction', 'receipt'")
        kind = present[0]
        body = obj[kind.value]
        if kind is RowKind.MESSAGE:
            fill_pi_defaults(body)
        return Row(
            session=rec.session,
            seq=rec.seq,
            run=rec.run,
            actor=rec.actor,
            kind=kind,
            body=body,
            sources=tuple(rec.sources),
            bytes=0,
            entry_id=rec.entry,
            extra=_extra(obj, _ROW_KEYS),
        )
    assert isinstance(rec, NoteRecord)
    extra = _extra(obj, _NOTE_KEYS)
    return Note(
        session=rec.session,
        agent=rec.agent,
        text=rec.text,
        at=rec.at,
        extra=extra,
        actor=rec.actor,
        run=rec.run,
        sources=tuple(rec.sources),
    )


def _extra(obj: dict[str, Any], known: set[str]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in known}


def parse_lines(lines: Iterable[bytes], source: str) -> Iterator[tuple[int, ParsedRecord]]:
    """Each non-blank line's number and record, checked on its own (not yet against the
    records before it: :func:`load_stream` does that)."""
    for lineno, raw in enumerate(lines, start=1):
        try:
            obj = _decode(raw)
            if obj is not None:
                yield lineno, _record(obj)
        except _Bad as exc:
            raise InterchangeError(source, lineno, str(exc)) from None


class _Checker:
    """The checks between records: ids unique, references known, seqs dense. Holds only ids and
    counters (never rows), so a load's memory does not grow with the file's rows."""

    def __init__(self, imp: Importer) -> None:
        self.imp = imp
        self.sessions: set[str] = set()
        self.runs: dict[str, str] = {}  # run id -> session (runs of this file)
        self.next_seq: dict[str, int] = {}
        self.requests: list[tuple[Run, int]] = []
        self.counts = [0, 0, 0, 0]

    def _session_known(self, sid: str) -> bool:
        if sid in self.next_seq:
            return True
        last = self.imp.last_seq(sid)
        if last is None:
            return False
        self.next_seq[sid] = last + 1
        return True

    def _run_session(self, rid: str) -> str | None:
        return self.runs.get(rid) or self.imp.run_session(rid)

    def add(self, rec: ParsedRecord, lineno: int) -> None:
        if isinstance(rec, Session):
            if rec.id in self.sessions or self.imp.last_seq(rec.id) is not None:
                raise _Bad(f"session {rec.id!r} is defined twice (or already exists in the ledger)")
            self.sessions.add(rec.id)
            self.next_seq[rec.id] = 1
            self.imp.session(rec)
            self.counts[0] += 1
        elif isinstance(rec, Run):
            if rec.id in self.runs or self.imp.run_session(rec.id) is not None:
                raise _Bad(f"run {rec.id!r} is defined twice (or already exists in the ledger)")
            if not self._session_known(rec.session):
                raise _Bad(f"run {rec.id!r} names unknown session {rec.session!r}")
            self.runs[rec.id] = rec.session
            if rec.request_seq is not None:
                self.requests.append((rec, lineno))
            self.imp.run(rec)
            self.counts[1] += 1
        elif isinstance(rec, Row):
            sid, seq = rec.session, rec.seq
            if not self._session_known(sid):
                raise _Bad(f"row names unknown session {sid!r}")
            expected = self.next_seq[sid]
            if seq < expected:
                raise _Bad(f"duplicate seq {seq} in session {sid!r} (expected {expected})")
            if seq > expected:
                raise _Bad(f"seq {seq} in session {sid!r} is not dense (expected {expected})")
            if rec.run is not None:
                owner = self._run_session(rec.run)
                if owner is None:
                    raise _Bad(f"row {seq} names unknown run {rec.run!r}")
                if owner != sid:
                    raise _Bad(
                        f"row {seq} of session {sid!r} names run {rec.run!r} of session {owner!r}"
                    )
            self.next_seq[sid] = seq + 1
            self.imp.row(rec, lineno)
            self.counts[2] += 1
        else:
            if not self._session_known(rec.session):
                raise _Bad(f"note names unknown session {rec.session!r}")
            self.imp.note(rec)
            self.counts[3] += 1

    def finish(self, source: str, lineno: int) -> LoadReport:
        for run, line in self.requests:
            assert run.request_seq is not None
            # next_seq continues the ledger's own rows for sessions it already holds
            if run.request_seq >= self.next_seq.get(run.session, 1):
                raise InterchangeError(
                    source, line, f"run {run.id!r} names request_seq {run.request_seq}, no such row"
                )
        return LoadReport(*self.counts)


def load_stream(ledger: Interchange, lines: Iterable[bytes], source: str = "<input>") -> LoadReport:
    """Check and write interchange lines in one transaction: all of them, or (on the first bad
    line, which the error names) none."""
    try:
        with ledger.importer() as imp:
            checker = _Checker(imp)
            lineno = 0
            for lineno, rec in parse_lines(lines, source):
                try:
                    checker.add(rec, lineno)
                except _Bad as exc:
                    raise InterchangeError(source, lineno, str(exc)) from None
            return checker.finish(source, lineno)
    except DuplicateEntry as exc:
        raise InterchangeError(source, exc.line, str(exc)) from None


def _split(data: bytes) -> Iterator[bytes]:
    # Split on b"\n" only: U+2028 and friends are legal inside JSON strings.
    for line in data.split(b"\n"):
        yield line.rstrip(b"\r")


def _read_lines(f: IO[bytes], source: str) -> Iterator[bytes]:
    """The file's lines, one at a time, each at most MAX_LINE_BYTES (+ its newline)."""
    lineno = 0
    while True:
        lineno += 1
        try:
            line = f.readline(MAX_LINE_BYTES + 2)
        except OSError as exc:
            raise InterchangeError(source, lineno, f"cannot read: {exc.strerror}") from exc
        if not line:
            return
        if line.endswith(b"\n"):
            line = line[:-1]
        elif len(line) > MAX_LINE_BYTES:
            raise InterchangeError(
                source, lineno, f"the line is longer than {MAX_LINE_BYTES} bytes"
            )
        yield line[:-1] if line.endswith(b"\r") else line


def load_lines(ledger: Interchange, data: bytes, source: str = "<input>") -> LoadReport:
    return load_stream(ledger, _split(data), source)


def load_file(ledger: Interchange, path: str | Path) -> LoadReport:
    """Load a JSONL file into the ledger in one transaction; a bad file writes nothing. The
    file is read a line at a time: memory does not grow with its size."""
    p = Path(path)
    try:
        f = p.open("rb")
    except OSError as exc:
        raise InterchangeError(str(p), 0, f"cannot read: {exc.strerror}") from exc
    with f:
        return load_stream(ledger, _read_lines(f, str(p)), str(p))


# allow_nan=False: NaN and Infinity are not JSON, and a dump must load again.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


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


def dump_session(ledger: Ledger, session_id: str, out: IO[str]) -> int:
    """Write one session as JSONL; returns the number of records written."""
    session = ledger.get_session(session_id)
    count = 0

    def emit(rec: dict[str, Any]) -> None:
        nonlocal count
        try:
            line = _ENCODER.encode(rec)
        except (ValueError, RecursionError) as exc:
            # A NaN or a surrogate stored before loads refused them: JSON cannot hold it.
            what = f"row {rec['seq']}" if rec.get("type") == "row" else f"a {rec.get('type')}"
            raise LedgerError(
                f"{what} of session {session_id!r} in {ledger.url} holds a value JSON cannot "
                f"carry ({exc}); fix that record in the ledger, then dump again"
            ) from exc
        out.write(line + "\n")
        count += 1

    emit(session_record(session))
    for run in ledger.runs(session_id):
        emit(run_record(run))
    for row in ledger.iter_rows(session_id):
        emit(row_record(row))
    for note in ledger.all_notes(session_id):
        emit(note_record(note))
    return count
