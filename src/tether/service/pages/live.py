"""``/live/runs/{run}/events``: a run's event stream for the pages' script;
``/live/sessions/{session}/events``: the runs that start in a session and its newest seq, so
that a page opened before a run starts shows it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header
from sse_starlette import EventSourceResponse, ServerSentEvent

from tether.errors import NotFound
from tether.ledger import Ledger, Run
from tether.service import stream
from tether.service.api import RunId, SessionId, blocking, session_or_404
from tether.service.pages.login import PageCaller, StateDep
from tether.service.state import ServiceState

__all__ = ["LIVE_EVENTS", "SESSION_POLL_S", "router"]

router = APIRouter(include_in_schema=False)

LIVE_EVENTS = frozenset({"status", "row", "checkpoint", "end"})


@router.get("/live/runs/{run}/events")
async def live_events(
    run: RunId,
    who: PageCaller,
    st: StateDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """The service's own event stream of a run (``GET /v1/runs/{run}/events``), reached with the
    login cookie: a browser's EventSource cannot send an Authorization header. Only the events
    that carry admission (status, row, checkpoint, end) pass: the pages render rows, not deltas,
    and a text delta is not checked against the sources of the row it will become."""
    response = await stream.run_events(run, who, st, last_event_id)
    return EventSourceResponse(_admitted_only(response.body_iterator), ping=15, send_timeout=30)


async def _admitted_only(events: AsyncIterable[Any]) -> AsyncIterator[Any]:
    try:
        async for event in events:
            if isinstance(event, ServerSentEvent) and event.event in LIVE_EVENTS:
                yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


SESSION_POLL_S = 1.0
"""How often an open session page's stream looks for new runs and rows, at least (a person
watching needs no faster; each look is two indexed reads)."""
SESSION_RUNS = 20


def _session_now(ledger: Ledger, session: str) -> tuple[list[Run], int]:
    """The session's running and queued runs (bounded, as the page lists them) and newest seq."""
    runs = ledger.live_runs(session=session) + ledger.queued_runs(session, limit=SESSION_RUNS)
    return runs, ledger.last_seq(session)


@router.get("/live/sessions/{session}/events")
async def session_events(session: SessionId, who: PageCaller, st: StateDep) -> EventSourceResponse:
    """``run`` ({run, status}) for each run that is queued or running and was not a moment
    before, and ``seq`` ({last_seq}) when the session's newest seq moves: the page follows the
    run's own stream, and fetches rows it has not shown (a run that started and ended between
    two looks, or was run by ``tether run``). Run ids, statuses and the newest seq are what
    the session's page shows anyone admitted to the session."""
    await blocking(session_or_404, st.ledger, session, who)
    return EventSourceResponse(_session_stream(st, session), ping=15, send_timeout=30)


async def _session_stream(st: ServiceState, session: str) -> AsyncIterator[ServerSentEvent]:
    known: set[str] = set()
    last = -1
    while not st.stopping:
        try:
            runs, seq = await blocking(_session_now, st.ledger, session)
        except NotFound:  # erased while the page was open: nothing more will come
            return
        for run in runs:
            if run.id not in known:
                data = {"run": run.id, "status": run.status.value}
                yield ServerSentEvent(data=json.dumps(data), event="run")
        known = {run.id for run in runs}  # bounded: only the ones still waiting or running
        if seq != last:
            last = seq
            yield ServerSentEvent(data=json.dumps({"last_seq": seq}), event="seq")
        await anyio.sleep(max(st.config.service.poll_s, SESSION_POLL_S))
