"""An async client for pi's RPC mode, over an :class:`AgentTransport`.

- Requests carry an ``id`` and are matched to their responses by it, whatever the order.
- pi answers a line it cannot parse with an id-less ``response`` (command ``parse``); such a
  response is reported to subscribers, and fails the one pending request it can only belong to.
- Every other record is an event, delivered in order to every subscriber.
- A line that is not a JSON object is reported to subscribers as a :class:`Stray`, never dropped.
- Blocking extension dialogs (``select``/``confirm``/``input``/``editor``) are answered at once
  with a cancellation (tether runs unattended, so no one could answer them); every extension UI
  request, ``notify`` included, is also delivered to subscribers.
- When the transport ends, every pending request fails with ``TransportClosed`` and every
  subscriber's stream ends.

The reader runs for as long as the client is open, so commands (``abort``, ``compact``,
``get_messages`` …) can be sent while events stream.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from tether.pi.errors import ProtocolError, TransportClosed
from tether.pi.jsonl import decode, encode
from tether.pi.protocol import DIALOG_METHODS, Command, Event, Response, UiMethod
from tether.pi.transport import AgentTransport

__all__ = ["Closed", "Record", "RpcClient", "Stray"]


class Stray(msgspec.Struct, frozen=True):
    """A stdout line that is not protocol (not JSON, or not a JSON object)."""

    line: bytes
    problem: str


class Closed(msgspec.Struct, frozen=True):
    """The last item of every subscription: the transport ended."""

    reason: str


Record = dict[str, Any] | Stray | Closed
"""What a subscriber receives: a pi record (event, extension UI request, id-less response), a
stray line, and finally ``Closed``."""


class _Pending:
    __slots__ = ("command", "done", "error", "response")

    def __init__(self, command: str) -> None:
        self.command = command
        self.done = anyio.Event()
        self.response: Response | None = None
        self.error: Exception | None = None


class RpcClient:
    """Use as ``async with RpcClient.connect(transport) as client``."""

    def __init__(self, transport: AgentTransport, *, id_prefix: str = "t") -> None:
        self._transport = transport
        self._prefix = id_prefix
        """Request ids are ``{prefix}{n}``: a harness that takes a run over uses its own prefix,
        so responses to its predecessor's requests (replayed from pi's events) never match."""
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}
        self._subscribers: list[MemoryObjectSendStream[Record]] = []
        self._listeners: list[Callable[[Record], None]] = []
        self._closed_reason: str | None = None
        self.closed = anyio.Event()
        """Set when the transport has ended (pi exited, was killed, or the client closed)."""
        self.strays = 0
        """How many non-protocol lines pi has written."""

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, transport: AgentTransport, *, id_prefix: str = "t"
    ) -> AsyncIterator[RpcClient]:
        client = cls(transport, id_prefix=id_prefix)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client._read, tg)
                try:
                    yield client
                finally:
                    tg.cancel_scope.cancel()
                    client._finish("the harness closed the connection")
        except BaseExceptionGroup as group:
            # The reader never raises: a group holds the caller's own exception. Give it back as
            # it was raised, not wrapped.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    @property
    def transport(self) -> AgentTransport:
        return self._transport

    @property
    def closed_reason(self) -> str | None:
        return self._closed_reason

    def subscribe(self) -> MemoryObjectReceiveStream[Record]:
        """Every record from now on, in order, ending with ``Closed``. Unbounded, so a slow
        subscriber never stalls the reader (and with it, command responses)."""
        send, receive = anyio.create_memory_object_stream[Record](math.inf)
        if self._closed_reason is not None:
            send.send_nowait(Closed(self._closed_reason))
            send.close()
        else:
            self._subscribers.append(send)
        return receive

    @asynccontextmanager
    async def listening(self, listener: Callable[[Record], None]) -> AsyncIterator[None]:
        """Call ``listener`` with every record from now on, in order, ending with ``Closed``,
        until the block ends (an async block, to sit beside the task group that follows pi's
        run; it never waits). It is called by the reader itself, before any subscriber's stream
        gets the record: no task and no stream per record, for a follower that only takes note
        (a run's state, its spans; about half of a run's event-loop steps were a follower's
        stream). It must not block; what it raises ends the client, as a failed read does."""
        if self._closed_reason is not None:
            listener(Closed(self._closed_reason))
            yield
            return
        self._listeners.append(listener)
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

    async def request(self, command: Command | str, **fields: Any) -> Response:
        """Send a command and wait for its response (success or not). Raises
        ``TransportClosed`` if pi goes away first."""
        if self._closed_reason is not None:
            raise TransportClosed(self._closed_reason)
        rid = f"{self._prefix}{next(self._ids)}"
        slot = _Pending(str(command))
        self._pending[rid] = slot
        try:
            await self._transport.send(encode({"id": rid, "type": str(command), **fields}))
            await slot.done.wait()
        finally:
            self._pending.pop(rid, None)
        if slot.error is not None:
            raise slot.error
        assert slot.response is not None
        return slot.response

    async def call(self, command: Command | str, **fields: Any) -> Any:
        """``request`` that raises ``ProtocolError`` when pi rejects the command; returns
        ``data``."""
        response = await self.request(command, **fields)
        if not response.success:
            raise ProtocolError(f"pi rejected {response.command}: {response.error}")
        return response.data

    # -- the reader ------------------------------------------------------------------------------

    def _broadcast(self, item: Record) -> None:
        for listener in list(self._listeners):
            listener(item)
        for send in list(self._subscribers):
            try:
                send.send_nowait(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._subscribers.remove(send)  # the subscriber went away

    def _finish(self, reason: str) -> None:
        if self._closed_reason is not None:
            return
        self._closed_reason = reason
        for slot in self._pending.values():
            if not slot.done.is_set():
                slot.error = TransportClosed(f"{slot.command}: {reason}")
                slot.done.set()
        listeners, self._listeners = self._listeners, []
        closed = Closed(reason)
        for listener in listeners:
            # The client ends whatever a listener does now (its failure, if that is why, is in
            # ``reason`` already): the reader never raises.
            with contextlib.suppress(Exception):
                listener(closed)
        self._broadcast(closed)
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()
        self.closed.set()

    async def _read(self, tg: anyio.abc.TaskGroup) -> None:
        try:
            async for line in self._transport.lines():
                if not line.strip():
                    continue
                try:
                    record = decode(line)
                except ValueError as exc:
                    self.strays += 1
                    self._broadcast(Stray(line, str(exc)))
                    continue
                kind = record.get("type")
                if kind == Event.RESPONSE:
                    self._on_response(record)
                elif kind == Event.EXTENSION_UI_REQUEST:
                    if record.get("method") in DIALOG_METHODS and isinstance(record.get("id"), str):
                        tg.start_soon(self._cancel_dialog, record["id"])
                    self._broadcast(record)
                elif isinstance(kind, str):
                    self._broadcast(record)
                else:
                    self.strays += 1
                    self._broadcast(Stray(line, "a JSON object without a string 'type'"))
        except Exception as exc:  # a transport failure ends the client like an EOF
            self._finish(f"reading pi's output failed: {exc}")
            return
        status = self._transport.exit_status
        detail = self._transport.diagnostics().strip()
        reason = "pi closed its output" + (f" (exit status {status})" if status is not None else "")
        if detail:
            reason += f"; pi's stderr ends with: {detail.splitlines()[-1]}"
        self._finish(reason)

    def _on_response(self, record: dict[str, Any]) -> None:
        response = Response.from_record(record)
        if response.id is not None and response.id in self._pending:
            slot = self._pending[response.id]
            slot.response = response
            slot.done.set()
            return
        # An id-less (or unknown-id) response: report it, and settle the request it must belong
        # to when there is exactly one candidate.
        self._broadcast(record)
        candidates = [
            s
            for s in self._pending.values()
            if not s.done.is_set() and (response.command in (s.command, "parse"))
        ]
        if len(candidates) == 1:
            candidates[0].response = response
            candidates[0].done.set()

    async def _cancel_dialog(self, ui_id: str) -> None:
        with contextlib.suppress(TransportClosed):
            await self._transport.send(
                encode(
                    {"type": Command.EXTENSION_UI_RESPONSE.value, "id": ui_id, "cancelled": True}
                )
            )


def is_notify(record: Record) -> bool:
    """An extension's ``ctx.ui.notify`` (how the continuation extension reports receipts)."""
    return (
        isinstance(record, dict)
        and record.get("type") == Event.EXTENSION_UI_REQUEST
        and record.get("method") == UiMethod.NOTIFY
    )
