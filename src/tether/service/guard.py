"""Request bodies bounded before anything reads them (an ASGI middleware, outside every route).

For each HTTP request, in this order and before a byte of its body is read:

1. on the API (``/v1/…``) the bearer token is checked: without a valid one, 401;
2. a ``Content-Length`` over the limit (``Config.body_limit``: ``[service] max_body_bytes``, by
   default room for the largest admissible request) is refused with 413;
3. the body is read up to the limit, and refused with 413 at the first byte beyond it (a chunked
   body has no length to check first); the route then reads it from memory.

A refused body is never read further: the server discards what the client still sends. So a
stream of oversized or unauthenticated bodies costs a serve process at most one limit per
request in flight, whatever their size.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.service.auth import authenticate
from tether.service.errors import error_response
from tether.service.state import ServiceState

__all__ = ["BodyGuard"]


class BodyGuard:
    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        config = self.state.config
        if scope["path"].startswith("/v1/"):
            try:
                authenticate(config.service.tokens, headers.get("authorization", ""))
            except HTTPException as exc:
                await self._refuse(scope, send, exc.status_code, exc.detail, exc.headers)
                return
        limit = config.body_limit
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            await self._refuse(scope, send, 413, _too_large(limit, int(length)))
            return
        if length in (None, "0") and "chunked" not in headers.get("transfer-encoding", ""):
            await self.app(scope, receive, send)  # no body
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._refuse(scope, send, 413, _too_large(limit, None))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(
        self,
        scope: Scope,
        send: Send,
        code: int,
        detail: object,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # Connection: close, so the server reads nothing more of this request's body.
        response = error_response(
            Request(scope), code, detail, {**(headers or {}), "Connection": "close"}
        )
        await response(scope, _no_body, send)


def _too_large(limit: int, length: int | None) -> str:
    got = f" ({length} bytes)" if length is not None else ""
    return (
        f"the request body is over {limit} bytes{got}, the most this server reads "
        "([service] max_body_bytes); send a smaller request"
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read once, then the client's own messages (a disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _no_body() -> Message:
    return {"type": "http.disconnect"}
