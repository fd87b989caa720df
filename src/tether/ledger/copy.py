"""Copying sessions between ledgers (``tether ledger copy``), e.g. SQLite to PostgreSQL.

A copy is exact: sessions, runs (status, epoch, request seq, timestamps, extra), rows (same seqs,
bodies, entry ids, sources, extra) and notes arrive as they were, so ``tether ledger dump`` of
both ledgers prints the same bytes. It is written in one transaction on the destination and
refuses, writing nothing, when a destination session already holds anything (an existing empty
session, say one made by ``ensure_session``, is taken over) or a run id is taken there.

Copy a quiescent session for an exact copy. A session being written meanwhile gets a consistent
prefix: its rows up to the ``last_seq`` seen when its copy began.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tether.errors import AlreadyExists, LedgerError
from tether.ledger.models import Note, Row, Run, Session
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


@dataclass(frozen=True)
class _Plan:
    session: Session
    last_seq: int
    runs: list[Run]
    notes: list[Note]


def _rows(src: Ledger, plans: Sequence[_Plan], counted: list[int]) -> Iterator[Row]:
    for plan in plans:
        after = 0
        while after < plan.last_seq:
            page = src.rows_range(plan.session.id, after + 1, plan.last_seq, limit=_PAGE)
            if not page or page[0].seq != after + 1 or page[-1].seq != after + len(page):
                # Raised inside the destination's transaction, so nothing is written.
                raise LedgerError(
                    f"session {plan.session.id!r} in the source has no dense rows after seq "
                    f"{after}; nothing was copied"
                )
            counted[0] += len(page)
            yield from page
            after = page[-1].seq


def _is_empty(dst: Ledger, session_id: str) -> bool:
    return (
        dst.last_seq(session_id) == 0
        and not dst.runs(session_id, limit=1)
        and not dst.all_notes(session_id)
    )


def copy_sessions(src: Ledger, dst: Ledger, sessions: Sequence[str] | None = None) -> CopyReport:
    """Copy ``sessions`` (default: every session of ``src``) into ``dst``, exactly.

    Raises ``NotFound`` for a session ``src`` lacks, and ``AlreadyExists`` (writing nothing)
    for a destination session that is not empty or a run id ``dst`` already holds."""
    ids = (
        list(sessions)
        if sessions is not None
        else [s.id for s in src.sessions(limit=_ALL_SESSIONS)]
    )
    ids = list(dict.fromkeys(ids))
    plans: list[_Plan] = []
    adopt: list[str] = []
    for sid in ids:
        session = src.get_session(sid)
        if dst.session(sid) is not None:
            if not _is_empty(dst, sid):
                raise AlreadyExists(
                    f"session {sid!r} already exists in the destination and is not empty; nothing "
                    "was copied (copy into another ledger, or leave that session out)"
                )
            adopt.append(sid)
        last = src.last_seq(sid)
        runs = src.runs(sid, limit=_ALL_SESSIONS)
        for run in runs:
            if dst.run(run.id) is not None:
                raise AlreadyExists(
                    f"run {run.id!r} of session {sid!r} already exists in the destination; nothing "
                    "was copied"
                )
        plans.append(_Plan(session, last, runs, src.all_notes(sid)))
    counted = [0]
    try:
        dst.copy_in(
            [p.session for p in plans],
            [r for p in plans for r in p.runs],
            _rows(src, plans, counted),
            [n for p in plans for n in p.notes],
            adopt=adopt,
        )
    except AlreadyExists as exc:
        raise AlreadyExists(f"{exc} (written meanwhile); nothing was copied") from exc
    return CopyReport(
        sessions=len(plans),
        runs=sum(len(p.runs) for p in plans),
        rows=counted[0],
        notes=sum(len(p.notes) for p in plans),
    )
