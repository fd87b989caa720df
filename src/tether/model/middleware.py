"""A pure ASGI middleware that applies :mod:`tether.model.compat` in front of llama-cpp-python's
server (added to its FastAPI app with ``add_middleware``, so Starlette's error handling wraps it).

Only ``POST …/chat/completions`` is touched: the body is read (Starlette's :class:`Request`) and
rewritten, the inner app is called with a non-streamed request and its whole response captured;
a successful answer to a streaming request is replayed as SSE, anything else (errors included)
is passed through unchanged, so the client sees the server's own status, headers and body.

The replay is one :class:`~starlette.responses.Response` with an SSE body, not an
``EventSourceResponse``: the completion has finished before the first byte is sent, so there is
nothing to stream, ping or drain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.model.compat import completion_to_sse, normalize_request

__all__ = ["ASGIApp", "CompatMiddleware"]


class CompatMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not scope.get("path", "").rstrip("/").endswith("/chat/completions")
        ):
            await self.app(scope, receive, send)
            return
        try:
            raw = await Request(scope, receive).body()
        except ClientDisconnect:
            return  # nobody is left to answer
        body = _json_object(raw)
        if body is None:
            # Not ours to judge: let the server answer malformed input with its own error.
            await self.app(scope, _replay(raw, receive), send)
            return
        request, plan = normalize_request(body)
        forwarded = json.dumps(request, ensure_ascii=False).encode()
        inner_scope = {**scope, "headers": list(scope.get("headers", []))}
        MutableHeaders(scope=inner_scope)["content-length"] = str(len(forwarded))

        answer = _Captured()
        await self.app(inner_scope, _replay(forwarded, receive), answer.send)
        completion = _json_object(answer.body) if answer.status == 200 and plan.stream else None
        if completion is None:
            response = Response(answer.body, status_code=answer.status)
            response.raw_headers = answer.headers
        else:
            response = Response(
                b"".join(completion_to_sse(completion, plan)),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        await response(scope, receive, send)


@dataclass
class _Captured:
    """The inner app's whole response."""

    status: int = 500
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.parts.append(message.get("body", b""))

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)


def _json_object(payload: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then defers to the client's (for disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
