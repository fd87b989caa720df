"""Invariant 9: the reads a follow-up view makes do not grow with the session's length.

A counting wrapper around the read API records every call, every row returned and every byte of
them; a session of 100,000 rows must cost exactly what one of 1,000 rows of the same recent shape
costs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from followup_sessions import bulk_session
from tether.followup import FollowupReads, FollowupView, Gap, GapWhy, build_view
from tether.ledger import Ledger, Note, Row, Run, TailRead, open_ledger


class CountingReads:
    """The read API, counting calls, rows (and runs, notes) returned and their bytes."""

    def __init__(self, inner: FollowupReads) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.rows = 0
        self.bytes = 0

    def _rows(self, rows: list[Row]) -> list[Row]:
        self.rows += len(rows)
        self.bytes += sum(r.bytes + r.media_bytes for r in rows)
        return rows

    def _one(self, row: Row | None) -> Row | None:
        return self._rows([row])[0] if row is not None else None

    def session(self, session_id: str) -> Any:
        self.calls["session"] += 1
        return self.inner.session(session_id)

    def latest_compaction(self, session_id: str) -> Row | None:
        self.calls["latest_compaction"] += 1
        return self._one(self.inner.latest_compaction(session_id))

    def last_ended_run(self, session_id: str, agent: str) -> Run | None:
        self.calls["last_ended_run"] += 1
        return self.inner.last_ended_run(session_id, agent)

    def ended_runs(self, session_id: str, agent: str, *, limit: int = 32) -> list[Run]:
        self.calls["ended_runs"] += 1
        runs = self.inner.ended_runs(session_id, agent, limit=limit)
        self.rows += len(runs)
        return runs

    def run_first_seq(self, run_id: str) -> int | None:
        self.calls["run_first_seq"] += 1
        return self.inner.run_first_seq(run_id)

    def row(self, session_id: str, seq: int) -> Row | None:
        self.calls["row"] += 1
        return self._one(self.inner.row(session_id, seq))

    def rows_range(self, session_id: str, first: int, last: int, *, limit: int = 1000) -> list[Row]:
        self.calls["rows_range"] += 1
        return self._rows(self.inner.rows_range(session_id, first, last, limit=limit))

    def tail(
        self, session_id: str, max_bytes: int, *, after: int = 0, max_rows: int = 20_000
    ) -> TailRead:
        self.calls["tail"] += 1
        read = self.inner.tail(session_id, max_bytes, after=after, max_rows=max_rows)
        self._rows(read.rows)
        return read

    def notes(
        self, session_id: str, agent: str, *, max_count: int = 32, max_bytes: int = 16_000
    ) -> list[Note]:
        self.calls["notes"] += 1
        notes = self.inner.notes(session_id, agent, max_count=max_count, max_bytes=max_bytes)
        self.rows += len(notes)
        self.bytes += sum(len(n.text.encode()) for n in notes)
        return notes


def measure(ledger: Ledger, session: str, budget: int) -> tuple[CountingReads, FollowupView]:
    counting = CountingReads(ledger)
    view = build_view(
        counting,
        session=session,
        agent="reviewer",
        actor="user:ana",
        budget=budget,
        grants={"user:ana": ["repo:*"]},
    )
    assert isinstance(view, FollowupView), view
    return counting, view


@pytest.mark.slow
@pytest.mark.parametrize(
    "checkpoint_every", [10, None], ids=["checkpoints", "one-early-checkpoint"]
)
def test_reads_do_not_grow_with_the_session(checkpoint_every: int | None) -> None:
    with open_ledger("memory:") as ledger:
        bulk_session(ledger, "s3", 1_000, checkpoint_every=checkpoint_every)
        bulk_session(ledger, "s5", 100_000, checkpoint_every=checkpoint_every)
        for budget in (8_000, 240_000):
            short, _ = measure(ledger, "s3", budget)
            long, long_view = measure(ledger, "s5", budget)
            assert long.calls == short.calls
            assert long.rows == short.rows
            # Only the seqs written inside compaction bodies (covers_to) are two digits wider.
            assert abs(long.bytes - short.bytes) <= 16
            # The bound is the budget, not the session: the tail reads what could fit.
            assert long.bytes <= 2 * budget + 8_000
            assert long.rows <= budget // 100 + 10
            assert long_view.checkpoint is not None
            if checkpoint_every is None:
                # The only checkpoint lies 99,990 rows behind the tail: read by index anyway.
                assert long_view.checkpoint.seq == 10
                assert long_view.gaps[0] == Gap(11, 100_000, GapWhy.BUDGET)
            assert long_view.previous_request is not None
            assert long_view.previous_request.seq == 100_001
            # The long final run fills the budget: the suffix reaches its end, the rest is named.
            assert long_view.bytes > budget * 0.9
            assert long_view.gaps[-1].last < 100_600
            assert long_view.messages[-1].synthetic
