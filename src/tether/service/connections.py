"""What a connection may cost a serve process before it has sent a request: ``tether serve``'s
HTTP protocol, uvicorn's h11 protocol with two bounds (``[service] head_timeout_s`` and
``max_connections``).

uvicorn (0.54, h11; httptools is not installed) starts its keep-alive timer only once a response
is complete, and stops it at the first byte of the next request: a connection that never
completes its first request head, or that sends half of its next one, is held for ever, each
holding an open file. Its ``limit_concurrency`` answers 503 to requests whose heads are complete
but closes nothing. So 1,500 clients that each send half a head keep 1,500 files open, and past
the usual limit of 1,024 the process cannot accept a connection (``EMFILE``), its health check
included.

Here a request head must be complete within ``head_timeout_s`` of the connection opening, or of
the answer before it on a kept-alive connection; otherwise the connection is closed (with a 408
when part of a head came). And at most ``max_connections`` are held: a new connection past it
takes the place of the one that has waited longest for a head (an idle or half-sent one), or, when
every one is busy with a request (a response, an event stream), is answered 503 and closed at once.
So the files a process holds for connections stay under ``max_connections``, whatever clients
do, and a client that sends its request at once is served even while others hang.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["bounded_http"]

_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 32\r\n\r\nthe request head came too slowly"
)
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: 35\r\n\r\n"
    b"too many connections; try again soon"
)


def bounded_http(head_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the two bounds, for ``uvicorn.Config(http=…)`` (one class per
    server: the connections it holds are the class's)."""
    if head_timeout_s <= 0 or max_connections < 1:
        raise ValueError("head_timeout_s must be positive and max_connections at least 1")
    held: set[Bounded] = set()
    """Every connection open and not being dropped."""
    waiting: OrderedDict[Bounded, None] = OrderedDict()
    """Those waiting for a request head, longest first."""

    class Bounded(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            held.add(self)
            if len(held) > max_connections:
                if not waiting:
                    self._drop(_FULL)  # every one is busy with a request
                    return
                oldest = next(iter(waiting))
                oldest._drop(None)
            self._wait_for_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._head_state()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._head_state()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            held.discard(self)
            super().connection_lost(exc)

        def _head_state(self) -> None:
            """Waiting for a head (h11's IDLE: nothing of the next request has been parsed,
            part of it may be buffered), or not."""
            if self.transport.is_closing() or self not in held:
                return
            if self.conn.their_state is h11.IDLE:
                self._wait_for_head()
            else:
                self._stop_waiting()

        def _wait_for_head(self) -> None:
            if self._head_timer is None:  # from the first moment it waits, not the last byte
                self._head_timer = self.loop.call_later(head_timeout_s, self._timed_out)
                waiting[self] = None

        def _stop_waiting(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            waiting.pop(self, None)

        def _timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE:
                partial = bool(self.conn.trailing_data[0])
                self._drop(_TIMED_OUT if partial else None)
            else:
                waiting.pop(self, None)

        def _drop(self, answer: bytes | None) -> None:
            self._stop_waiting()
            held.discard(self)
            if not self.transport.is_closing():
                if answer is not None:
                    self.transport.write(answer)
                self.transport.close()

    Bounded.__name__ = Bounded.__qualname__ = "BoundedH11Protocol"
    return Bounded
