"""The service's HTTP server spans, as OpenTelemetry's HTTP conventions have them: a route opens
its span with :func:`server_span` (``{method} {route}``, SERVER, the request's ``traceparent`` as
parent) and :class:`ServerSpans`, an ASGI middleware outside the app's exception handlers, ends it
once the response is sent, with ``http.response.status_code`` of the status actually answered,
whether the route returned or raised (a refusal the handlers turn into a 409, a ledger error into
a 503). Only a 5xx marks the span an error (``error.type`` the status code): a server's 4xx is
the client's error, not the server's. An exception no handler answers is a 500, its
``error.type`` the exception's type.

Off (tracing not on), :func:`server_span` returns the no-op span and the middleware only passes
the request on.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether import telemetry
from tether.telemetry import Span

__all__ = ["ServerSpans", "server_span"]

_KEY = "tether.server_span"
"""The scope key of the list the route's span is put in (the middleware reads it back)."""


def server_span(
    request: Request,
    route: str,
    attrs: Mapping[str, telemetry.Attr | None],
    *,
    parent: str | None,
) -> Span:
    """Open the request's SERVER span (the caller does not end it: :class:`ServerSpans` does)."""
    method = request.method
    span = telemetry.start(
        f"{method} {route}",
        {
            "http.request.method": method,
            "http.route": route,
            "url.path": request.url.path,
            "url.scheme": request.url.scheme,
            **attrs,
        },
        parent=parent,
        kind="server",
    )
    held = request.scope.get(_KEY)
    if isinstance(held, list):
        held.append(span)
    else:  # not under the middleware (a bare router in a test): nothing would end it
        span.end()
    return span


class ServerSpans:
    """Ends the server span a route opened, with the status the client was answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: list[Span] = []
        scope[_KEY] = held
        answered: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            # Unanswered, the app's outermost layer answers 500, unless the request was
            # cancelled (the client went away): then nothing was answered.
            cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
            status = answered[0] if answered else (None if cancelled else 500)
            for span in held:
                _end(span, status, type(exc).__name__)
            raise
        status = answered[0] if answered else None
        for span in held:
            _end(span, status, str(status) if status is not None and status >= 500 else None)


def _end(span: Span, status: int | None, error: str | None) -> None:
    span.set({"http.response.status_code": status})
    if error is not None:
        span.fail(error)
    span.end()
