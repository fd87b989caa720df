"""Forks by reference (docs/operations.md#erasure-and-retention): a session forked from S at a run
begins as S up to the
end of that run, without a row copied. Its record names its parent and three bounds: the last
inherited seq (``fork_seq``; its own rows continue from there, so the seqs of a fork's view are
dense and never clash with the parent's), the last inherited run (``fork_ord``, runs are ordered
globally) and the last inherited note (``fork_note``, note ids are global too).

A read of a session walks its lineage (the session, its parent, the parent's parent…) as
:class:`Segment` values: which seqs, runs and notes of which session the view holds. The walk
reads one session record per level, and a fork refuses to go deeper than :data:`MAX_DEPTH`
levels, so a read stays bounded whatever the history's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from tether.ledger.codec import Cursor

__all__ = ["MAX_DEPTH", "NO_BOUND", "Segment", "lineage", "seq_filter"]

MAX_DEPTH = 32
"""A fork of a fork of… at most this many levels (each read walks them)."""
NO_BOUND = 2**62


class Segment(msgspec.Struct, frozen=True):
    """Seqs ``lo``–``hi`` of ``session`` are the view's; so are its runs with ``ord <=
    max_ord`` and its notes with ``id <= max_note`` (no bound on the session itself)."""

    session: str
    lo: int
    hi: int
    max_ord: int
    max_note: int
    depth: int


def lineage(c: Cursor, session_id: str) -> list[Segment]:
    """The segments of a session's view, its own first. A session that does not exist is one
    segment of itself (its reads find nothing)."""
    out: list[Segment] = []
    cur, hi, max_ord, max_note = session_id, NO_BOUND, NO_BOUND, NO_BOUND
    for depth in range(MAX_DEPTH + 1):
        c.execute("SELECT parent, fork_seq, fork_ord, fork_note FROM sessions WHERE id = ?", (cur,))
        r = c.fetchone()
        if r is None or r[0] is None:
            out.append(Segment(cur, 1, hi, max_ord, max_note, depth))
            break
        parent, fork_seq, fork_ord, fork_note = r[0], int(r[1]), int(r[2]), int(r[3])
        if fork_seq + 1 <= hi:
            out.append(Segment(cur, fork_seq + 1, hi, max_ord, max_note, depth))
        hi, max_ord, max_note = min(hi, fork_seq), min(max_ord, fork_ord), min(max_note, fork_note)
        cur = parent
    return out


def seq_filter(segments: Sequence[Segment], first: int, last: int) -> tuple[str, list[Any]]:
    """A WHERE condition on ``session`` and ``seq`` for seqs ``first``–``last`` of the view
    (and its parameters)."""
    parts: list[str] = []
    params: list[Any] = []
    for s in segments:
        lo, hi = max(first, s.lo), min(last, s.hi)
        if lo <= hi:
            parts.append("(session = ? AND seq >= ? AND seq <= ?)")
            params += [s.session, lo, hi]
    if not parts:
        return "1 = 0", []
    return ("(" + " OR ".join(parts) + ")" if len(parts) > 1 else parts[0]), params
