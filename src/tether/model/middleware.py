"""An ASGI wrapper that applies :mod:`tether.model.compat` in front of llama-cpp-python's server.

Only ``POST …/chat/completions`` is touched: the body is rewritten, the inner app is called with
a non-streamed request and its whole response captured; a successful answer to a streaming
request is replayed as SSE, anything else (errors included) is passed through unchanged, so the
client sees the server's own status and error body.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tether.model.compat import completion_to_sse, normalize_request

__all__ = ["ASGIApp", "CompatMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


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
        raw = await _read_body(receive)
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        if not isinstance(body, dict):
            # Not ours to judge: let the server answer malformed input with its own error.
            await self.app(scope, _replay(raw, receive), send)
            return
        request, plan = normalize_request(body)
        new_raw = json.dumps(request, ensure_ascii=False).encode()
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(new_raw)).encode()))
        inner_scope = {**scope, "headers": headers}

        status = 500
        response_headers: list[tuple[bytes, bytes]] = []
        parts: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal status, response_headers
            if message["type"] == "http.response.start":
                status = int(message["status"])
                response_headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        await self.app(inner_scope, _replay(new_raw, receive), capture)
        payload = b"".join(parts)
        completion = _json_object(payload) if status == 200 and plan.stream else None
        if completion is None:
            await send(
                {"type": "http.response.start", "status": status, "headers": response_headers}
            )
            await send({"type": "http.response.body", "body": payload})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        for event in completion_to_sse(completion, plan):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


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
