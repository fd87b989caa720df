"""Rows: fenced appends (dense seqs, idempotent by pi entry id, a checkpoint's covered sources
stamped at write time) and the bounded reads of rows: one row, the newest
compaction, a capped range or its sizes, a byte-capped tail."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from tether.ids import check_id
from tether.ledger import codec
from tether.ledger.base import SqlBase
from tether.ledger.codec import Cursor, encode_row
from tether.ledger.lineage import NO_BOUND, Segment, lineage, seq_filter
from tether.ledger.models import (
    Fence,
    NewRow,
    Row,
    RowKind,
    RowSize,
    TailRead,
)

__all__ = ["DEFAULT_TAIL_ROWS", "TAIL_PAGE", "RowsSql"]

# A tail read takes rows newest first in pages of this many.
TAIL_PAGE = 256
DEFAULT_TAIL_ROWS = 20_000


class RowsSql(SqlBase):
    """Rows: appends and bounded reads."""

    def append(self, fence: Fence, rows: Sequence[NewRow], *, request: bool = False) -> list[Row]:
        """Append rows under a fence, in one transaction: all or nothing.

        Rows that carry a pi ``entry_id`` already in the session are not appended again (the
        stored row is returned in their place), so a mirror that restarts never duplicates.
        With ``request=True`` the single row is recorded as the run's request."""
        if request and len(rows) != 1:
            raise ValueError("a run has exactly one request row")
        if not rows:
            return []
        for name in dict.fromkeys(new.actor for new in rows):  # a batch has few actors
            check_id("actor", name)
        with self._tx() as c:
            self._check_fence(c, fence)
            if request:
                # A run has one request row: a second request append is a retry whose first
                # attempt committed (its acknowledgement lost with the connection).
                c.execute(
                    f"SELECT {codec.ROW_COLS} FROM rows WHERE session = ? AND seq = "
                    "(SELECT request_seq FROM runs WHERE id = ?)",
                    (fence.session, fence.run),
                )
                found = c.fetchone()
                if found is not None:
                    return [codec.row_of(found)]
            existing: dict[str, Row] = {}
            ids = [r.entry_id for r in rows if r.entry_id is not None]
            if ids:
                marks = ", ".join("?" for _ in ids)
                c.execute(
                    f"SELECT {codec.ROW_COLS} FROM rows WHERE session = ? "
                    f"AND entry_id IN ({marks})",
                    (fence.session, *ids),
                )
                existing = {
                    row.entry_id: row for row in map(codec.row_of, c.fetchall()) if row.entry_id
                }
            fresh = [r for r in rows if r.entry_id is None or r.entry_id not in existing]
            encoded: list[tuple[Any, ...]] = []
            if fresh:
                c.execute(
                    "UPDATE sessions SET last_seq = last_seq + ? WHERE id = ? RETURNING last_seq",
                    (len(fresh), fence.session),
                )
                last = int(c.fetchone()[0])
                first = last - len(fresh) + 1
                fresh = self._with_covered_sources(c, fence.session, first, fresh)
                encoded = [
                    encode_row(fence.session, first + i, fence.run, r) for i, r in enumerate(fresh)
                ]
                self._insert_rows(c, encoded)
                if request:
                    c.execute("UPDATE runs SET request_seq = ? WHERE id = ?", (first, fence.run))
        # Positional: a named tuple built by keyword costs about twice as much.
        made = [
            Row(
                e[0],
                e[1],
                e[2],
                r.actor,
                r.kind,
                r.body,
                tuple(r.sources),
                e[7],
                e[8],
                r.entry_id,
                r.extra,
            )
            for e, r in zip(encoded, fresh, strict=True)
        ]
        if not existing:
            return made
        fresh_rows = iter(made)
        return [
            existing[r.entry_id]
            if r.entry_id is not None and r.entry_id in existing
            else next(fresh_rows)
            for r in rows
        ]

    def _with_covered_sources(
        self, c: Cursor, session_id: str, first: int, fresh: Sequence[NewRow]
    ) -> list[NewRow]:
        """Give each compaction row the union of the sources of the rows it covers, at write
        time, so a follow-up that reads the checkpoint by index never
        has to read what it covers. The newest earlier compaction already holds the union below
        its own coverage, so only the rows after that coverage are read."""
        if not any(new.kind is RowKind.COMPACTION for new in fresh):
            return list(fresh)  # the common batch: messages only
        out: list[NewRow] = []
        for new in fresh:
            covers = new.body.get("covers_to") if new.kind is RowKind.COMPACTION else None
            if not isinstance(covers, int) or isinstance(covers, bool) or covers < 1:
                out.append(new)
                continue
            union: set[str] = set()
            stored_to = min(covers, first - 1)
            if stored_to >= 1:
                start = 1
                segments = lineage(c, session_id)
                prev = _newest_compaction(
                    c, self._compactions_hint, segments, stored_to, "seq, body"
                )
                if prev is not None:
                    below = json.loads(prev[1]).get("covers_to")
                    if isinstance(below, int) and not isinstance(below, bool):
                        start = max(1, min(below, int(prev[0]) - 1) + 1)
                where, params = seq_filter(segments, start, stored_to)
                c.execute(
                    f"SELECT DISTINCT sources FROM rows WHERE {where} AND sources <> '[]'", params
                )
                for (text,) in c.fetchall():
                    union.update(json.loads(text))
            for j, prior in enumerate(out):
                if first + j <= covers:
                    union.update(prior.sources)
            added = sorted(union - set(new.sources))
            out.append(
                msgspec.structs.replace(new, sources=(*new.sources, *added)) if added else new
            )
        return out

    def row(self, session_id: str, seq: int) -> Row | None:
        """One exact row, by seq."""
        with self._read() as c:
            where, params = seq_filter(lineage(c, session_id), seq, seq)
            c.execute(f"SELECT {codec.ROW_COLS} FROM rows WHERE {where}", params)
            r = c.fetchone()
        return _as(session_id, codec.row_of(r)) if r else None

    def latest_compaction(self, session_id: str) -> Row | None:
        """The newest compaction row of the session, wherever it lies."""
        with self._read() as c:
            r = _newest_compaction(
                c, self._compactions_hint, lineage(c, session_id), NO_BOUND, codec.ROW_COLS
            )
        return _as(session_id, codec.row_of(r)) if r else None

    def run_first_seq(self, run_id: str) -> int | None:
        """The seq of the first row a run wrote, None when it wrote none (index rows_by_run)."""
        with self._read() as c:
            c.execute("SELECT seq FROM rows WHERE run = ? ORDER BY seq LIMIT 1", (run_id,))
            r = c.fetchone()
        return int(r[0]) if r else None

    def run_rows_before(self, run_id: str, before: int, *, limit: int = 50) -> list[Row]:
        """A run's rows with ``seq < before``, newest first, at most ``limit`` of them (index
        rows_by_run): the end of a run without reading it from its start."""
        with self._read() as c:
            c.execute(
                f"SELECT {codec.ROW_COLS} FROM rows WHERE run = ? AND seq < ? "
                "ORDER BY seq DESC LIMIT ?",
                (run_id, before, limit),
            )
            return [codec.row_of(r) for r in c.fetchall()]

    def rows_range(self, session_id: str, first: int, last: int, *, limit: int = 1000) -> list[Row]:
        """Rows with ``first <= seq <= last``, ascending, at most ``limit`` of them."""
        # Seqs are dense, so the first `limit` rows lie in [first, first + limit - 1]: bounding
        # the range keeps the read bounded whatever plan the database picks (PostgreSQL without
        # fresh statistics may fetch the whole range and sort it).
        last = min(last, first + limit - 1)
        with self._read() as c:
            where, params = seq_filter(lineage(c, session_id), first, last)
            c.execute(
                f"SELECT {codec.ROW_COLS} FROM rows WHERE {where} ORDER BY seq LIMIT ?",
                (*params, limit),
            )
            return [_as(session_id, codec.row_of(r)) for r in c.fetchall()]

    def row_sizes(
        self, session_id: str, first: int, last: int, *, limit: int = 1000
    ) -> list[RowSize]:
        """The stored sizes and sources of rows with ``first <= seq <= last``, ascending, at
        most ``limit`` of them: no bodies, so a reader can pick the rows whose bodies it needs
        before it reads them (:meth:`rows_range`)."""
        last = min(last, first + limit - 1)  # seqs are dense: see rows_range
        with self._read() as c:
            where, params = seq_filter(lineage(c, session_id), first, last)
            c.execute(
                f"SELECT seq, bytes, sources FROM rows WHERE {where} ORDER BY seq LIMIT ?",
                (*params, limit),
            )
            return [codec.size_of(session_id, *r) for r in c.fetchall()]

    def tail(
        self,
        session_id: str,
        max_bytes: int,
        *,
        after: int = 0,
        max_rows: int = DEFAULT_TAIL_ROWS,
    ) -> TailRead:
        """The newest contiguous rows with ``seq > after`` whose stored sizes fit ``max_bytes``,
        read newest first in pages and returned oldest first. Stops at the first row that does
        not fit: a tail is contiguous."""
        taken: list[Row] = []
        total = 0
        with self._read() as c:
            c.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,))
            found = c.fetchone()
            segments = lineage(c, session_id)
            # Seqs are dense, so each page is a window of TAIL_PAGE seqs below the newest: the
            # read stays bounded whatever plan the database picks for a range. Sizes come first,
            # from the (session, seq, bytes) index, and bodies only for the rows taken: a page
            # of huge rows past the budget is never read.
            top = int(found[0]) if found else after
            newest = top
            while top > after:
                low = max(after, top - TAIL_PAGE)
                where, params = seq_filter(segments, low + 1, top)
                c.execute(
                    f"SELECT seq, bytes FROM rows WHERE {where} ORDER BY seq DESC LIMIT ?",
                    (*params, TAIL_PAGE),
                )
                stop: int | None = None
                first = top + 1
                for seq, size in c.fetchall():
                    if total + size > max_bytes or len(taken) + (top - seq) >= max_rows:
                        stop = seq
                        break
                    total += size
                    first = seq
                if first <= top:
                    where, params = seq_filter(segments, first, top)
                    c.execute(
                        f"SELECT {codec.ROW_COLS} FROM rows WHERE {where} ORDER BY seq DESC",
                        params,
                    )
                    taken.extend(_as(session_id, codec.row_of(r)) for r in c.fetchall())
                if stop is not None:
                    taken.reverse()
                    return TailRead(rows=taken, bytes=total, stop_seq=stop, last_seq=newest)
                top = low
        taken.reverse()
        return TailRead(rows=taken, bytes=total, stop_seq=None, last_seq=newest)

    def iter_rows(self, session_id: str, *, page: int = 1000) -> Iterator[Row]:
        """Every row of a session up to its last seq when the read begins, in seq order (for
        dumps and exports, not for follow-ups). Read a window of ``page`` seqs at a time: a
        window holds fewer rows where some were erased, and the rows after it are read all the
        same."""
        with self._read() as c:
            c.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,))
            found = c.fetchone()
        last = int(found[0]) if found else 0
        after = 0
        while after < last:
            yield from self.rows_range(session_id, after + 1, last, limit=page)
            after += page


def _as(session_id: str, row: Row) -> Row:
    """A row as the session read sees it: an inherited row (a fork's) names the fork."""
    return row if row.session == session_id else row._replace(session=session_id)


def _newest_compaction(
    c: Cursor, hint: str, segments: list[Segment], at_most: int, columns: str
) -> Any:
    """The newest compaction row of the view with ``seq <= at_most`` (by index, one segment
    after another, the session's own first): its ``columns``, or None."""
    for s in segments:
        hi = min(s.hi, at_most)
        if hi < s.lo:
            continue
        c.execute(
            f"SELECT {columns} FROM rows {hint} WHERE session = ? AND kind = 'compaction' "
            "AND seq >= ? AND seq <= ? ORDER BY seq DESC LIMIT 1",
            (s.session, s.lo, hi),
        )
        r = c.fetchone()
        if r is not None:
            return r
    return None
