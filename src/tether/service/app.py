"""The service's ASGI app (docs/contracts.md#the-http-api).

    app = create_app(config, ledger, workers=2)   # uvicorn.run(app) — or `tether serve`

Routers live in their own modules (``api``: the JSON API, ``stream``: event streams, ``ops``:
health and metrics), so pages for people are one more router: ``app.include_router(pages)``.
With ``workers`` > 0 the app runs a :class:`~tether.service.worker.Worker` of that concurrency
inside its lifespan: ``tether serve`` alone is the whole platform on one machine.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import FastAPI, Request, Response

from tether.config import Config
from tether.ledger import Fence, Ledger
from tether.pi.install import PiInstall
from tether.service import api, budgets, control, docs, errors, limits, ops, pages, stream
from tether.service.guard import BodyGuard
from tether.service.state import ServiceState, service_of
from tether.service.tracing import ServerSpans
from tether.service.worker import Worker

__all__ = ["create_app"]

log = logging.getLogger(__name__)

STOPPING = "stopping: no more claims; live runs finish until [service] drain_s or are handed over"


def create_app(
    config: Config,
    ledger: Ledger,
    *,
    workers: int = 0,
    pi: PiInstall | None = None,
    on_handover: Callable[[list[Fence]], None] | None = None,
) -> FastAPI:
    """The service over ``ledger``. ``workers``: concurrency of the in-process worker (0: none,
    the runs are taken by ``tether worker`` processes). ``on_handover``: see
    :class:`~tether.service.worker.Worker` (``tether serve`` exits there, leaving the runs
    still live at the drain deadline to the next worker's reconcile)."""
    st = ServiceState(config=config, ledger=ledger)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if workers <= 0:
            yield
            st.stopping = True
            return
        worker = Worker(
            ledger,
            config,
            concurrency=workers,
            hub=st.hub,
            metrics=st.metrics,
            pi=pi,
            on_handover=on_handover,
        )
        st.workers.append(worker)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            try:
                yield
            finally:
                st.stopping = True
                log.info(STOPPING)
                worker.stop()

    app = FastAPI(
        title="tether",
        summary="Run pi coding agents on long-lived sessions (docs/contracts.md#the-http-api).",
        version="1",
        lifespan=lifespan,
        # /docs is the service's own (tether.service.docs): FastAPI's loads Swagger UI from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = st
    app.include_router(api.router)
    app.include_router(control.router)
    app.include_router(stream.router)
    app.include_router(ops.router)
    app.include_router(pages.router)
    docs.install(app)
    errors.install(app)
    limits.install(app)  # after: a request over a limit is a 429, not the ledger's 503
    budgets.install(app)  # and one over its actor's budget (tether.service.budgets)
    # Before the timing middleware below: that one wraps this, so refusals are counted too.
    app.add_middleware(BodyGuard, state=st)
    # Outside the exception handlers: a route's server span ends with the status answered.
    app.add_middleware(ServerSpans)

    @app.middleware("http")
    async def timed(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route: Any = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        service_of(request.app).metrics.observe(
            request.method, path, response.status_code, time.perf_counter() - started
        )
        return response

    return app
