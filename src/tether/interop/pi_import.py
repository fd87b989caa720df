"""A pi session file into the ledger, in bounded memory.

pi's own rules (``dist/core/session-manager.js`` of the pinned package) are followed:

* lines are split on ``\\n`` only; a line that is not JSON (pi's ``JSON.parse`` refuses it,
  ``NaN`` included) is skipped, as pi skips it, and counted;
* version 1 files get ids and a linear parent chain, and a compaction's ``firstKeptEntryIndex``
  becomes ``firstKeptEntryId``; version 2's ``hookMessage`` role is ``custom``;
* the active branch is the last entry back to the root through ``parentId`` (an unknown parent
  ends the walk);
* ``context_edit`` entries on the branch are applied to their targets (the latest wins): a null
  replacement leaves the target out, a replacement changes the content of a user, assistant,
  tool-result or custom message (a string becomes one text block for assistants and results);
* what each entry stands for (null content read as pi reads it, ``hookMessage`` as ``custom``
  …) is :mod:`tether.pi.sessionformat`, which the mirror reads a run's file with too: the same
  entry becomes the same row either way.

Runs: the ``tether.run`` entries of a file tether exported (:mod:`tether.interop.pi_format`) are
the runs it held, each with its status, times, rows (from its first row's entry to its last's)
and request, whatever user messages those rows hold (a run's copy of its previous request,
steering). The other rows (all of a file pi wrote) make one run per user message that starts a
turn; a user message right after a tool result is steering inside the running turn and belongs
to it. System messages right before a turn's user message open that turn's run. Rows before the
first turn, or after a tether run's rows and before the next turn, belong to no run.

A compaction covers the rows before its first kept entry (all rows before it when that entry is
not on the branch before it: pi keeps none then).

Memory: the first pass keeps each entry's shape (id, parent, offset, type, role), not its body;
the second reads the bodies of the branch's entries by offset, and rows stream into the
ledger's one import transaction a chunk at a time.
"""

from __future__ import annotations

import enum
import json
import sys
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tether.errors import AlreadyExists, InterchangeError
from tether.ids import check_id, new_run_id
from tether.interop.pi_format import AFTER_KEY, BEFORE_KEY, HEADER_KEY, PI_KEY, RUN_TYPE
from tether.ledger import ENDED_STATUSES, Ledger, Row, RowKind, Run, RunStatus, Session
from tether.ledger.models import now_iso
from tether.mirror.entries import ROW_KINDS, Actors, entry_row
from tether.pi.sessionformat import BODY_FIELDS, EntryKind, entry_kind

__all__ = ["ImportPlan", "ImportReport", "LeftOut", "import_pi", "plan_import"]

DEFAULT_ACTOR = "user:pi"
"""The actor of imported user messages when ``--actor`` is not given."""

_EDITABLE_ROLES = frozenset({"user", "assistant", "toolResult", "custom"})
_TURN_ROLES = frozenset({"user", "assistant", "toolResult"})


class LeftOut(enum.StrEnum):
    """What an import does not bring into the ledger."""

    OFF_BRANCH = "off_branch"
    """Entries that are not on the active branch."""
    CONTEXT_EDIT = "context_edit"
    """Edit entries: applied to their targets, not kept themselves."""
    OMITTED_BY_EDIT = "omitted_by_edit"
    """Entries a ``context_edit`` with a null replacement removed from the context."""
    MALFORMED = "malformed"
    """Lines that are not JSON objects (pi skips them too)."""


@dataclass(frozen=True, slots=True)
class _PlannedRow:
    pos: int
    """Index of the entry in the file's entry list."""
    kind: RowKind
    run: int | None
    """Index into the plan's runs."""
    before: tuple[int, ...]
    """Bookkeeping entries that ride on this row."""
    covers_to: int = 0
    edit: int | None = None
    """The context_edit entry applied to this row (its replacement is not null)."""


@dataclass(frozen=True, slots=True)
class _PlannedRun:
    request_row: int | None
    """Index into the plan's rows."""
    first_row: int
    last_row: int
    """Inclusive; ``first_row - 1`` for a run without rows."""
    record: dict[str, Any] | None = None
    """The ``data`` of the run's ``tether.run`` entry (None: a run made from a user turn)."""
    marker: int | None = None
    """That entry's index in the file's entry list."""


@dataclass
class ImportReport:
    session: str
    version: int
    entries: int
    runs: int
    rows: int
    compactions: int
    edited: int
    """Rows whose content a context_edit replaced."""
    bookkeeping: dict[str, int] = field(default_factory=dict)
    """Bookkeeping entries kept (in row and session extras), by entry type."""
    left_out: dict[LeftOut, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "version": self.version,
            "entries": self.entries,
            "runs": self.runs,
            "rows": self.rows,
            "compactions": self.compactions,
            "edited": self.edited,
            "bookkeeping": dict(sorted(self.bookkeeping.items())),
            "left_out": {k.value: v for k, v in sorted(self.left_out.items())},
        }


@dataclass
class ImportPlan:
    """The first pass: the shape of every entry and what becomes of the active branch's."""

    path: Path
    header: dict[str, Any]
    version: int
    ids: list[str]
    offsets: array[int]
    lengths: array[int]
    lines: array[int]
    rows: list[_PlannedRow]
    runs: list[_PlannedRun]
    after: tuple[int, ...]
    report: ImportReport
    first_kept: dict[int, str] = field(default_factory=dict)
    """Compaction entry index → its first kept entry id (after the v1 migration)."""

    def read_entry(self, f: IO[bytes], pos: int) -> dict[str, Any]:
        f.seek(self.offsets[pos])
        entry: dict[str, Any] = _loads(f.read(self.lengths[pos]))
        if self.version < 2:
            entry["id"] = self.ids[pos]
            entry["parentId"] = self.ids[pos - 1] if pos > 0 else None
            if entry.get("type") == "compaction":
                entry.pop("firstKeptEntryIndex", None)
                if pos in self.first_kept:
                    entry["firstKeptEntryId"] = self.first_kept[pos]
        return entry


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(raw: bytes) -> Any:
    # pi decodes the file as UTF-8 with replacement characters, then JSON.parse, which refuses
    # NaN and Infinity: the same here
    return json.loads(raw.decode("utf-8", "replace"), parse_constant=_reject_constant)


def plan_import(path: str | Path, *, session: str = "") -> ImportPlan:
    """Read the file's shape (not its bodies) and plan the rows and runs of its active branch."""
    p = Path(path)
    source = str(p)
    ids: list[str] = []
    parents: list[str | None] = []
    # The shape of every entry, compactly: 10^5 entries take a few MB besides their ids.
    offsets: array[int] = array("q")
    lengths: array[int] = array("q")
    lines: array[int] = array("q")
    types: list[str] = []
    kinds: list[EntryKind] = []
    roles: list[str | None] = []
    info: dict[int, Any] = {}
    runs_of: dict[int, dict[str, Any]] = {}
    """Entry index → the data of a ``tether.run`` entry."""
    header: dict[str, Any] | None = None
    malformed = 0
    try:
        f = p.open("rb")
    except OSError as exc:
        raise InterchangeError(source, 0, f"cannot read: {exc.strerror}") from exc
    with f:
        offset = 0
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                entry = _loads(raw)
            except ValueError:
                malformed += 1
                continue
            if not isinstance(entry, dict):
                malformed += 1
                continue
            if header is None:
                if entry.get("type") != "session" or not isinstance(entry.get("id"), str):
                    raise InterchangeError(
                        source, lineno, "not a pi session file: the first entry is not a header"
                    )
                header = entry
                continue
            kind = entry.get("type")
            kind = kind if isinstance(kind, str) else ""
            pos = len(ids)
            ids.append(str(entry.get("id")) if entry.get("id") is not None else "")
            parent = entry.get("parentId")
            parents.append(parent if isinstance(parent, str) else None)
            offsets.append(start)
            lengths.append(len(raw))
            lines.append(lineno)
            types.append(sys.intern(kind))
            kinds.append(entry_kind(entry))
            role = None
            if kind == "message" and isinstance(entry.get("message"), dict):
                role = entry["message"].get("role")
                role = "custom" if role == "hookMessage" else role
            roles.append(sys.intern(role) if isinstance(role, str) else None)
            if kind == "context_edit":
                info[pos] = (entry.get("targetId"), entry.get("replacement") is None)
            elif (
                kind == "custom"
                and entry.get("customType") == RUN_TYPE
                and isinstance(entry.get("data"), dict)
            ):
                runs_of[pos] = entry["data"]
            elif kind == "compaction":
                info[pos] = entry.get("firstKeptEntryId", entry.get("firstKeptEntryIndex"))
    if header is None:
        raise InterchangeError(source, 0, "not a pi session file: it holds no header")
    version = header.get("version", 1)
    version = version if isinstance(version, int) else 1

    first_kept: dict[int, str] = {}
    if version < 2:
        # pi's migration: ids in file order, each entry the child of the one before; a
        # compaction's index counts the header as entry 0.
        ids = [f"{i:08x}" for i in range(len(ids))]
        parents = [None, *ids[:-1]] if ids else []
        for pos, value in info.items():
            if types[pos] == "compaction" and isinstance(value, int) and 1 <= value <= len(ids):
                first_kept[pos] = ids[value - 1]
    else:
        for pos, value in info.items():
            if types[pos] == "compaction" and isinstance(value, str):
                first_kept[pos] = value

    index = {eid: i for i, eid in enumerate(ids)}
    branch: list[int] = []
    seen: set[int] = set()
    at: int | None = len(ids) - 1 if ids else None
    while at is not None and at not in seen:
        seen.add(at)
        branch.append(at)
        parent = parents[at]
        at = index.get(parent) if parent is not None else None
    branch.reverse()
    del parents, index, seen

    report = ImportReport(
        session=session,
        version=version,
        entries=len(ids),
        runs=0,
        rows=0,
        compactions=0,
        edited=0,
    )
    left_out: Counter[LeftOut] = Counter()
    left_out[LeftOut.OFF_BRANCH] = len(ids) - len(branch)
    left_out[LeftOut.MALFORMED] = malformed

    # context_edit: the latest edit of each target on the branch wins
    edits: dict[str, tuple[int, bool]] = {}
    for pos in branch:
        if types[pos] == "context_edit":
            target, is_null = info[pos]
            if isinstance(target, str):
                edits[target] = (pos, is_null)

    rows: list[_PlannedRow] = []
    row_roles: list[str | None] = []
    rows_before: dict[str, int] = {}
    """Entry id → how many rows precede that entry on the branch (for covers_to)."""
    before: list[int] = []
    bookkeeping: Counter[str] = Counter()
    markers: list[tuple[int, int]] = []
    """The ``tether.run`` entries on the branch: (rows before it, its entry index)."""
    for pos in branch:
        rows_before.setdefault(ids[pos], len(rows))
        kind = kinds[pos]
        if kind is EntryKind.EDIT:
            left_out[LeftOut.CONTEXT_EDIT] += 1
            continue
        if pos in runs_of:
            markers.append((len(rows), pos))
            continue
        row_kind = ROW_KINDS.get(kind)
        if row_kind is None:
            before.append(pos)
            bookkeeping[types[pos] or "unknown"] += 1
            continue
        edit = edits.get(ids[pos])
        if edit is not None and edit[1]:
            left_out[LeftOut.OMITTED_BY_EDIT] += 1
            continue
        covers_to = 0
        if row_kind is RowKind.COMPACTION:
            report.compactions += 1
            kept = first_kept.get(pos)
            # pi keeps from the first kept entry only when it lies on the branch before the
            # compaction; otherwise it keeps nothing from before the compaction
            covers_to = rows_before.get(kept, len(rows)) if kept is not None else len(rows)
        role = "custom" if types[pos] == "custom_message" else roles[pos]
        applied = None
        if edit is not None and role in _EDITABLE_ROLES and row_kind is RowKind.MESSAGE:
            applied = edit[0]
            report.edited += 1
        rows.append(_PlannedRow(pos, row_kind, None, tuple(before), covers_to, applied))
        row_roles.append(role if row_kind is RowKind.MESSAGE else None)
        before = []
    after = tuple(before)

    runs = _plan_runs(rows, row_roles, ids, rows_before, markers, runs_of)
    planned: list[_PlannedRow] = []
    run_of: list[int | None] = [None] * len(rows)
    for k, r in enumerate(runs):
        for i in range(r.first_row, r.last_row + 1):
            run_of[i] = k
    del runs_of, rows_before
    for i, row in enumerate(rows):
        planned.append(
            _PlannedRow(row.pos, row.kind, run_of[i], row.before, row.covers_to, row.edit)
        )

    report.rows = len(planned)
    report.runs = len(runs)
    report.bookkeeping = dict(bookkeeping)
    report.left_out = {k: v for k, v in left_out.items() if v}
    return ImportPlan(
        path=p,
        header=header,
        version=version,
        ids=ids,
        offsets=offsets,
        lengths=lengths,
        lines=lines,
        rows=planned,
        runs=runs,
        after=after,
        report=report,
        first_kept=first_kept,
    )


def _plan_runs(
    rows: list[_PlannedRow],
    roles: list[str | None],
    ids: list[str],
    rows_before: dict[str, int],
    markers: list[tuple[int, int]],
    runs_of: dict[int, dict[str, Any]],
) -> list[_PlannedRun]:
    """The runs of the branch's rows, in the file's order: the ``tether.run`` entries' first,
    then one per user turn among the rows none of them holds."""
    n = len(rows)

    def row_at(eid: Any) -> int | None:
        """The index of the row the entry became, None when it became none."""
        at = rows_before.get(eid) if isinstance(eid, str) else None
        return at if at is not None and at < n and ids[rows[at].pos] == eid else None

    held: list[int | None] = [None] * n
    found: list[tuple[int, int, _PlannedRun]] = []
    """(where it sorts, 0 for a run without rows or 1, the run)."""
    end = 0
    for place, pos in markers:
        data = runs_of[pos]
        first = rows_before.get(data["first"]) if isinstance(data.get("first"), str) else None
        last = row_at(data.get("last"))
        lo, hi = (
            (max(first, end), min(last + 1, place))
            if first is not None and last is not None
            else (place, place)
        )
        if lo >= hi:
            lo = hi = place
        request = row_at(data.get("request"))
        run = _PlannedRun(
            request if request is not None and lo <= request < hi else None,
            lo,
            hi - 1,
            record=data,
            marker=pos,
        )
        found.append((lo, 0 if lo == hi else 1, run))
        for i in range(lo, hi):
            held[i] = len(found) - 1
        end = max(end, hi)

    # one per user message that starts a turn, among the rows no tether run holds
    starts: list[int] = []
    last_turn_role: str | None = None
    for i, role in enumerate(roles):
        if held[i] is not None:
            last_turn_role = None
            continue
        if role == "user" and last_turn_role != "toolResult":
            starts.append(i)
        if role in _TURN_ROLES:
            last_turn_role = role
    firsts: list[int] = []
    for k, s in enumerate(starts):
        first, floor = s, starts[k - 1] if k else -1
        while first - 1 > floor and held[first - 1] is None and roles[first - 1] == "system":
            first -= 1
        firsts.append(first)
    for k, (s, first) in enumerate(zip(starts, firsts, strict=True)):
        last = firsts[k + 1] - 1 if k + 1 < len(firsts) else n - 1
        stop = next((i for i in range(s, last + 1) if held[i] is not None), None)
        if stop is not None:
            last = stop - 1
        found.append((first, 1, _PlannedRun(request_row=s, first_row=first, last_row=last)))
    found.sort(key=lambda f: (f[0], f[1]))
    return [run for *_, run in found]


def _rest(entry: dict[str, Any], kind: str) -> dict[str, Any]:
    known = BODY_FIELDS.get(kind, frozenset({"type", "id", "parentId"}))
    return {k: v for k, v in entry.items() if k not in known}


def _bookkeeping(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "parentId"}


_UNREADABLE = {
    RowKind.MESSAGE: "a message entry holds no message with a role",
    RowKind.RECEIPT: "a tether receipt entry has no kind",
    RowKind.COMPACTION: "a compaction entry is unreadable",
}


def _apply_edit(message: dict[str, Any], replacement: Any) -> dict[str, Any]:
    if not isinstance(replacement, dict) or "content" not in replacement:
        return message
    content = replacement["content"]
    if message.get("role") in ("assistant", "toolResult") and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    return {**message, "content": content}


def iter_rows(plan: ImportPlan, session: str, run_ids: list[str], actors: Actors) -> Iterator[Row]:
    """The second pass: the planned rows with their bodies, in seq order."""
    source = str(plan.path)
    with plan.path.open("rb") as f:
        for seq, planned in enumerate(plan.rows, start=1):
            entry = plan.read_entry(f, planned.pos)
            kind = str(entry.get("type"))
            line = plan.lines[planned.pos]
            extra: dict[str, Any] = {}
            rest = _rest(entry, kind)
            if rest:
                extra[PI_KEY] = rest
            if planned.before:
                extra[BEFORE_KEY] = [_bookkeeping(plan.read_entry(f, b)) for b in planned.before]
            if planned.kind is RowKind.COMPACTION and not isinstance(entry.get("summary"), str):
                raise InterchangeError(source, line, "a compaction entry has no summary")
            # the mirror's mapping, so an imported entry is the row a mirrored one is
            row = entry_row(entry, actors, covers_to=planned.covers_to)
            if row is None:
                raise InterchangeError(source, line, _UNREADABLE[planned.kind])
            body = row.body
            if planned.edit is not None:
                edit = plan.read_entry(f, planned.edit)
                body = _apply_edit(body, edit.get("replacement"))
            yield Row(
                session=session,
                seq=seq,
                run=run_ids[planned.run] if planned.run is not None else None,
                actor=row.actor,
                kind=row.kind,
                body=body,
                sources=(),
                bytes=0,
                entry_id=row.entry_id,
                extra=extra,
            )


def _span(plan: ImportPlan, f: IO[bytes], run: _PlannedRun) -> tuple[RunStatus, Any, Any]:
    """A run's status, start and end: its ``tether.run`` entry's (the end, when it has none,
    the entry's time), else finished with the timestamps of its first and last entries."""
    if run.record is not None and run.marker is not None:
        status = run.record.get("status")
        started, ended = run.record.get("started"), run.record.get("ended")
        if not isinstance(ended, str):
            ended = plan.read_entry(f, run.marker).get("timestamp")
        known = {s.value: s for s in ENDED_STATUSES}
        found = known.get(status) if isinstance(status, str) else None
        return found or RunStatus.FINISHED, started, ended
    return (
        RunStatus.FINISHED,
        plan.read_entry(f, plan.rows[run.first_row].pos).get("timestamp"),
        plan.read_entry(f, plan.rows[run.last_row].pos).get("timestamp"),
    )


def import_pi(
    ledger: Ledger,
    path: str | Path,
    *,
    session: str,
    agent: str,
    actor: str | None = None,
) -> ImportReport:
    """Bring a pi session file into a new ledger session, in one transaction (a bad file or a
    taken session id writes nothing)."""
    check_id("session", session)
    check_id("agent", agent)
    if actor is not None:
        check_id("actor", actor)
    if ledger.session(session) is not None:
        raise AlreadyExists(
            f"session {session!r} already exists; import into a new session id "
            "(`tether sessions` lists the taken ones)"
        )
    plan = plan_import(path, session=session)
    header = {k: v for k, v in plan.header.items() if k not in ("type", "version")}
    extra: dict[str, Any] = {HEADER_KEY: header}
    if plan.after:
        with plan.path.open("rb") as f:
            extra[AFTER_KEY] = [_bookkeeping(plan.read_entry(f, b)) for b in plan.after]
    created = plan.header.get("timestamp")
    record = Session(
        id=session, created=created if isinstance(created, str) else now_iso(), extra=extra
    )
    run_ids = [new_run_id() for _ in plan.runs]
    runs = []
    with plan.path.open("rb") as f:
        spans = [_span(plan, f, r) for r in plan.runs]
    for rid, planned, (status, started, ended) in zip(run_ids, plan.runs, spans, strict=True):
        runs.append(
            Run(
                id=rid,
                session=session,
                agent=agent,
                status=status,
                request_seq=planned.request_row + 1 if planned.request_row is not None else None,
                started=started if isinstance(started, str) else None,
                ended=ended if isinstance(ended, str) else None,
            )
        )
    actors = Actors(user=actor or DEFAULT_ACTOR, agent=agent)
    ledger.import_records([record], runs, iter_rows(plan, session, run_ids, actors), [])
    return plan.report
