"""Copying sessions between ledgers (``tether ledger copy``), e.g. SQLite to PostgreSQL.

A copy is exact: sessions, runs (status, epoch, request seq, timestamps, extra, custody: a queued
run keeps its request id, actor and waiter), rows (same seqs, bodies, entry ids, sources,
extra; the seqs an erasure left unused stay unused), notes, and with every session the erasure
receipts, so ``tether ledger dump`` of each session prints the same bytes in both ledgers. It is
written in one transaction on the destination and refuses, writing nothing, when a destination
session already holds anything (an existing empty session, say one made by ``ensure_session``,
is taken over) or a run id is taken there.

Forks (:mod:`tether.ledger.lineage`) are copied as they are stored. A fork copied with the
session it was forked from (or one further up its lineage) stays a fork of it, by reference; its
bounds on the ledger's global orders (runs' ``ord``, notes' ids) are translated into the
destination's, which the copy keeps in the same order. A fork copied without any session of its
lineage is written whole: what it inherits is stored under it, so it holds what its view holds
and nothing of its parent's rows after the fork. Two forks copied so cannot both hold the run
records they inherit from one session (run ids are unique): that is refused, naming the session
to copy with them.

Copy a quiescent session for an exact copy. A session being written meanwhile gets a consistent
prefix: its rows up to the ``last_seq`` seen when its copy began.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from tether.errors import AlreadyExists, UsageError
from tether.ledger.imports import CopiedSession, ForkLink, StoredNote, StoredRun
from tether.ledger.lineage import MAX_DEPTH, NO_BOUND
from tether.ledger.models import Row
from tether.ledger.roles import Ledger

__all__ = ["CopyReport", "copy_sessions"]

_PAGE = 1000
_ALL_SESSIONS = 2**31


@dataclass(frozen=True)
class CopyReport:
    sessions: int
    runs: int
    rows: int
    notes: int
    forks: int = 0
    """Of the sessions, the forks copied as forks (by reference)."""
    erasures: int = 0
    """Erasure receipts copied (with every session, not with ``--session``)."""


class _Level(NamedTuple):
    """One level of a session's lineage as :func:`tether.ledger.lineage.lineage` walks it:
    the seqs ``lo``–``hi`` stored under ``session``, its runs with ``ord <= max_ord`` and its
    notes with ``id <= max_note``; a level whose seqs are empty (``lo > hi``) holds nothing."""

    session: str
    lo: int
    hi: int
    max_ord: int
    max_note: int

    @property
    def holds(self) -> bool:
        return self.lo <= self.hi


def _levels(src: Ledger, session_id: str) -> list[_Level]:
    """The session's lineage, its own level first, each level with its bounds: the walk of
    ``lineage``, keeping the levels that hold nothing too (an ancestor is one all the same)."""
    out: list[_Level] = []
    cur, hi, max_ord, max_note = session_id, NO_BOUND, NO_BOUND, NO_BOUND
    for _ in range(MAX_DEPTH + 1):
        link = src.fork_link(cur)
        if link is None:
            out.append(_Level(cur, 1, hi, max_ord, max_note))
            break
        out.append(_Level(cur, link.seq + 1, hi, max_ord, max_note))
        hi, max_ord = min(hi, link.seq), min(max_ord, link.ord)
        max_note = min(max_note, link.note)
        cur = link.parent
    return out


@dataclass
class _Plan:
    session: CopiedSession
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    """The rows to copy: (session stored under, first seq, last seq), ascending."""
    runs: list[StoredRun] = field(default_factory=list)
    notes: list[StoredNote] = field(default_factory=list)
    inherited: dict[str, str] = field(default_factory=dict)
    """Run id → the session whose record it is, for the runs a flattened fork inherits."""


def _plan(src: Ledger, session_id: str, last: int, selected: set[str]) -> _Plan:
    """What copying ``session_id`` writes, as its lineage stores it: its own records, and those
    of each level up to the nearest session of ``selected`` (it stays a fork of that one), or
    of every level when there is none."""
    levels = _levels(src, session_id)
    near = next((i for i in range(1, len(levels)) if levels[i].session in selected), None)
    fork = None
    if near is not None:
        top = levels[near]
        fork = ForkLink(top.session, top.hi, top.max_ord, top.max_note)
        levels = levels[:near]
    plan = _Plan(CopiedSession(src.get_session(session_id), last, fork))
    for level in reversed(levels):  # the oldest first: seqs and orders ascend
        if not level.holds:
            continue
        max_ord = None if level.max_ord >= NO_BOUND else level.max_ord
        max_note = None if level.max_note >= NO_BOUND else level.max_note
        for stored in src.stored_runs(level.session, max_ord=max_ord):
            plan.runs.append(stored.under(session_id))
            if level.session != session_id:
                plan.inherited[stored.run.id] = level.session
        for n in src.stored_notes(level.session, max_note=max_note):
            plan.notes.append(n._replace(note=msgspec.structs.replace(n.note, session=session_id)))
        plan.spans.append((level.session, level.lo, min(level.hi, last)))
    return plan


def _rows(src: Ledger, plans: Sequence[_Plan], counted: list[int]) -> Iterator[Row]:
    """Every planned row, a window of seqs at a time (a window holds fewer rows where some
    were erased), each written under the session it is copied for."""
    for plan in plans:
        sid = plan.session.session.id
        for stored_under, lo, hi in plan.spans:
            first = lo
            while first <= hi:
                page = src.rows_range(stored_under, first, hi, limit=_PAGE)
                counted[0] += len(page)
                for row in page:
                    yield row if row.session == sid else row._replace(session=sid)
                first += _PAGE


def _is_empty(dst: Ledger, session_id: str) -> bool:
    return (
        dst.last_seq(session_id) == 0
        and not dst.runs(session_id, limit=1)
        and not dst.all_notes(session_id)
    )


def copy_sessions(src: Ledger, dst: Ledger, sessions: Sequence[str] | None = None) -> CopyReport:
    """Copy ``sessions`` (default: every session of ``src``, and its erasure receipts) into
    ``dst``, exactly.

    Raises ``NotFound`` for a session ``src`` lacks, ``AlreadyExists`` (writing nothing) for a
    destination session that is not empty or a run id ``dst`` already holds, and
    ``UsageError`` (writing nothing) for forks that would both hold the same inherited run."""
    whole = sessions is None
    ids = (
        list(sessions)
        if sessions is not None
        else [s.id for s in src.sessions(limit=_ALL_SESSIONS)]
    )
    ids = list(dict.fromkeys(ids))
    selected = set(ids)
    plans: list[_Plan] = []
    adopt: list[str] = []
    holder: dict[str, str] = {}
    for sid in ids:
        src.get_session(sid)  # NotFound before anything else is read
        if dst.session(sid) is not None:
            if not _is_empty(dst, sid):
                raise AlreadyExists(
                    f"session {sid!r} already exists in the destination and is not empty; nothing "
                    "was copied (copy into another ledger, or leave that session out)"
                )
            adopt.append(sid)
        plan = _plan(src, sid, src.last_seq(sid), selected)
        for stored in plan.runs:
            rid = stored.run.id
            if rid in holder:
                origin = plan.inherited.get(rid) or sid
                raise UsageError(
                    f"sessions {holder[rid]!r} and {sid!r} both inherit run {rid!r} of session "
                    f"{origin!r}, which is not copied; nothing was copied (copy {origin!r} with "
                    "them, and they stay forks of it)"
                )
            holder[rid] = sid
            if dst.run(rid) is not None:
                parent = plan.inherited.get(rid)
                where = f" (inherited from session {parent!r})" if parent else ""
                raise AlreadyExists(
                    f"run {rid!r} of session {sid!r}{where} already exists in the destination; "
                    "nothing was copied"
                )
        plans.append(plan)
    erasures = list(reversed(src.erasures(limit=_ALL_SESSIONS))) if whole else []
    counted = [0]
    try:
        dst.copy_in(
            [p.session for p in plans],
            [r for p in plans for r in p.runs],
            _rows(src, plans, counted),
            [n for p in plans for n in p.notes],
            erasures=erasures,
            adopt=adopt,
        )
    except AlreadyExists as exc:
        raise AlreadyExists(f"{exc} (written meanwhile); nothing was copied") from exc
    return CopyReport(
        sessions=len(plans),
        runs=sum(len(p.runs) for p in plans),
        rows=counted[0],
        notes=sum(len(p.notes) for p in plans),
        forks=sum(p.session.fork is not None for p in plans),
        erasures=len(erasures),
    )
