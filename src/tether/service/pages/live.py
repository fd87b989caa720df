"""``/live/runs/{run}/events``: a run's event stream for the pages' script."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header
from sse_starlette import EventSourceResponse, ServerSentEvent

from tether.service import stream
from tether.service.api import RunId
from tether.service.pages.login import PageCaller, StateDep

__all__ = ["LIVE_EVENTS", "router"]

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
