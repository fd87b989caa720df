"""What one actor may ask of the service (``[service.limits]``), as the ledger counts it: the
limits of a request (:func:`request_limits`), the bound workers claim by (:func:`live_bound`),
and the answer to a request over one (429 with ``Retry-After``; :func:`install`).

The counts are the ledger's (the runs table), taken in the transaction that inserts the run
(:mod:`tether.ledger.limits`), so they hold across every serve process and worker on one
PostgreSQL, and a refused request writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from tether.config import Config
from tether.harness.relay import Deliver
from tether.ledger.limits import LimitExceeded, RunLimits

__all__ = ["install", "live_bound", "request_limits"]


def request_limits(config: Config, actor: str, deliver: Deliver) -> RunLimits:
    """The limits a request of ``actor`` is admitted by. A request for the session's live run
    (``steer``, ``follow_up``) starts no run of its own: the live bound is not asked of it (it
    becomes a queued run when the live run has settled, and a worker starts it within the
    bound)."""
    queued, live, per_minute = config.service.limits.of(actor)
    return RunLimits(
        queued=queued,
        live=live if deliver is Deliver.QUEUE else None,
        per_minute=per_minute,
    )


def live_bound(config: Config) -> Callable[[str], int]:
    """Actor -> the runs of it a worker may have live at once, for ``claim_next``."""
    limits = config.service.limits

    def bound(actor: str) -> int:
        return limits.of(actor)[1]

    return bound


def install(app: FastAPI) -> None:
    """Answer a request over a limit: 429, ``Retry-After`` in seconds, and the refusal in the
    API's shape, ``{"detail": {"status": "refused", "reason": "limit", "limit": …}}`` (only the
    API's requests are limited: always JSON)."""

    async def over_limit(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LimitExceeded)
        detail = {"status": "refused", "reason": "limit", **exc.to_json(), "detail": str(exc)}
        return JSONResponse(
            {"detail": detail}, status_code=429, headers={"Retry-After": str(exc.retry_after_s)}
        )

    app.add_exception_handler(LimitExceeded, over_limit)
