"""A run's answer as the API reads it: the row it was mirrored from (admission applies to that
row's sources). ``GET /v1/runs/{run}`` and the webhooks' events (``tether.service.webhooks``)
both read it here."""

from __future__ import annotations

from tether.ledger import Ledger, Row, RowKind, Run

__all__ = ["answer_row"]


def answer_row(ledger: Ledger, run: Run) -> Row | None:
    """The run's last assistant message row (what its answer was mirrored from)."""
    first = ledger.run_first_seq(run.id)
    if first is None:
        return None
    found: Row | None = None
    start = first
    while True:
        page = ledger.rows_range(run.session, start, start + 999)
        mine = [r for r in page if r.run == run.id]
        found = next(
            (r for r in reversed(mine) if r.kind is RowKind.MESSAGE and r.role == "assistant"),
            found,
        )
        if len(page) < 1000 or (page and page[-1].run != run.id):
            return found
        start = page[-1].seq + 1
