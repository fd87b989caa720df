"""``GET /v1/runs/{run}/events``: a run as server-sent events, from any serve process.

The ledger is the source: rows by seq (admission applied) and the run's status, polled (and
woken at once when a worker of this process mirrors rows). Text deltas and tool calls come only
when a worker of this process holds the run, through the stream's own bounded subscription to the
:class:`~tether.service.hub.LiveHub` (a stream that falls behind loses them, never a row); the
rows they end in come from every process.

Event ids: a row's id is its seq; any other event's id is ``SEQ.N`` (the newest row seq sent
before it, and a counter). ``Last-Event-ID`` resumes after that seq: rows after it are sent again
from the ledger, then the current status, then the live tail.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, status
from sse_starlette import EventSourceResponse, ServerSentEvent

from tether.events import AnswerDelta, RowsMirrored, RunEvent, ToolFinished, ToolStarted
from tether.ledger import ENDED_STATUSES, Ledger, Row, Run, RunStatus
from tether.service.api import (
    CallerDep,
    RunId,
    StateDep,
    blocking,
    row_json,
    run_json,
    sees_session,
)
from tether.service.auth import Caller
from tether.service.state import ServiceState

__all__ = ["parse_event_id", "router"]

router = APIRouter(prefix="/v1", tags=["v1"])
PAGE = 500


def parse_event_id(value: str | None) -> int | None:
    """The row seq a ``Last-Event-ID`` resumes after (None when absent or not one of ours)."""
    if not value:
        return None
    head = value.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _start_after(ledger: Ledger, run: Run) -> int:
    """The seq before the run's first row: its rows are all after it. The session's last seq
    is read first, so rows the run writes meanwhile are never missed."""
    last = ledger.last_seq(run.session)
    first = ledger.run_first_seq(run.id)
    return first - 1 if first is not None else last


def _rows_after(ledger: Ledger, run: Run, after: int) -> tuple[list[Row], int]:
    """The run's rows after ``after`` (one page) and how far the scan got."""
    page = ledger.rows_range(run.session, after + 1, after + PAGE, limit=PAGE)
    return [r for r in page if r.run == run.id], (page[-1].seq if page else after)


class _Stream:
    def __init__(self, st: ServiceState, run: Run, who: Caller, after: int) -> None:
        self.st = st
        self.run = run
        self.who = who
        self.scanned = after
        self.sent = after
        self.n = 0
        self.status: RunStatus | None = None
        # Text deltas and tool calls are not rows: no sources to admit them by. The run was
        # given only what its own actor may read, so they go to that actor alone; anyone
        # else follows the run through its rows, which admission filters.
        asked = run.extra.get("request") or {}
        self.live_allowed = who.actor == asked.get("actor")

    def _id(self) -> str:
        self.n += 1
        return f"{self.sent}.{self.n}"

    def _event(
        self, kind: str, data: dict[str, Any], event_id: str | None = None
    ) -> ServerSentEvent:
        return ServerSentEvent(
            data=json.dumps(data, ensure_ascii=False), event=kind, id=event_id or self._id()
        )

    async def _rows(self) -> AsyncIterator[ServerSentEvent]:
        while True:
            rows, scanned = await blocking(_rows_after, self.st.ledger, self.run, self.scanned)
            for row in rows:
                self.sent, self.n = row.seq, 0
                yield self._event("row", row_json(row, self.who, self.st.paths), str(row.seq))
            if scanned - self.scanned < PAGE:
                self.scanned = scanned
                return
            self.scanned = scanned

    async def events(self) -> AsyncIterator[ServerSentEvent]:
        st = self.st
        # Subscribed before the first ledger read: no live event falls between the two.
        live = st.hub.subscribe(self.run.id)
        try:
            while True:
                current = await blocking(st.ledger.get_run, self.run.id)
                ended = current.status in ENDED_STATUSES
                if current.status is not self.status and (not ended or self.status is None):
                    self.status = current.status
                    yield self._event("status", {"run": current.id, "status": current.status.value})
                # Rows after the status was read: once it reads ended, every row is in.
                async for event in self._rows():
                    yield event
                if ended:
                    async for event in self._end(current):
                        yield event
                    return
                if st.stopping:
                    return
                # Live events of a run a worker of this process holds.
                fresh = live.take()
                for ev in fresh if self.live_allowed else ():
                    shown = self._live_event(ev)
                    if shown is not None:
                        yield shown
                if any(isinstance(ev, RowsMirrored) for ev in fresh):
                    continue
                if live.ended and not live.overflowed:
                    # The run ended here or was handed over; it may be resumed here again.
                    live.close()
                    live = st.hub.subscribe(self.run.id)
                    continue
                await live.wait(st.config.service.poll_s)
        finally:
            live.close()

    def _live_event(self, ev: RunEvent) -> ServerSentEvent | None:
        if isinstance(ev, AnswerDelta):
            return self._event("text", {"delta": ev.text})
        if isinstance(ev, ToolStarted):
            return self._event("tool", {"phase": "start", "call_id": ev.call_id, "name": ev.name})
        if isinstance(ev, ToolFinished):
            return self._event(
                "tool",
                {"phase": "end", "call_id": ev.call_id, "name": ev.name, "is_error": ev.is_error},
            )
        return None

    async def _end(self, current: Run) -> AsyncIterator[ServerSentEvent]:
        if current.status is not self.status:
            self.status = current.status
            yield self._event("status", {"run": current.id, "status": current.status.value})
        yield self._event(
            "checkpoint", {"run": current.id, "checkpoint": current.extra.get("checkpoint")}
        )
        try:
            end = await blocking(run_json, self.st.ledger, current, self.who)
        except HTTPException:  # not admitted to the answer: the end without it
            end = {"run": current.id, "status": current.status.value, "withheld": True}
        yield self._event("end", end)


@router.get(
    "/runs/{run}/events",
    summary="The run as server-sent events (status, text, tool, row, checkpoint, end)",
    response_class=EventSourceResponse,
)
async def run_events(
    run: RunId,
    who: CallerDep,
    st: StateDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    found = await blocking(st.ledger.run, run)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run!r}")
    if not await blocking(sees_session, st.ledger, found.session, who):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"{who.actor} is not admitted to session {found.session!r}"
        )
    after = parse_event_id(last_event_id)
    if after is None:
        after = await blocking(_start_after, st.ledger, found)
    stream = _Stream(st, found, who, after)
    return EventSourceResponse(stream.events(), ping=15, send_timeout=30)
