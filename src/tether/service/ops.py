"""``/healthz`` and ``/metrics``: no token (they say nothing about any session's content)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from tether.errors import LedgerError
from tether.service.api import StateDep, blocking

__all__ = ["router"]

router = APIRouter(tags=["operations"])
log = logging.getLogger(__name__)


@router.get("/healthz", summary="Whether the service can read its ledger")
async def healthz(st: StateDep) -> JSONResponse:
    body: dict[str, Any] = {
        "status": "ok",
        "workers": sum(getattr(w, "concurrency", 0) for w in st.workers),
        "live_here": len(st.hub.live()),
        "stopping": st.stopping,
    }
    try:
        await blocking(st.ledger.sessions, limit=1)
    except LedgerError as exc:
        # No token needed here: the failure's text (it can name the ledger's path) is logged.
        log.warning("healthz: the ledger cannot be read: %s", exc)
        body.update(status="unavailable", error="the ledger cannot be read (see the server's log)")
        return JSONResponse(body, status_code=503)
    return JSONResponse(body, status_code=503 if st.stopping else 200)


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus text")
async def metrics(st: StateDep) -> PlainTextResponse:
    counts = await blocking(st.ledger.run_counts)
    # Usage by agent and model, never by actor (a label per actor would grow without bound):
    # `tether usage` sums the same rows by actor.
    usage = await blocking(st.ledger.usage_totals, by=("agent", "model"))
    return PlainTextResponse(
        st.metrics.render(counts, usage), media_type="text/plain; version=0.0.4; charset=utf-8"
    )
