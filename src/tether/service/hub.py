"""Live events of the runs this process's workers execute (text deltas, tool calls, rows
mirrored), handed to the event streams of this process.

Nothing is kept per run: each subscriber (one event stream) has its own bounded buffer (an anyio
memory object stream of :data:`LIVE_BUFFER` events), and an event published with no subscriber is
gone. So a serve process holds at most ``LIVE_BUFFER`` events per open stream, however long a run
goes on.

When a subscriber's buffer is full (its client reads slower than the run writes), the hub drops
that subscriber: it keeps what it has buffered and gets no more live events. Its stream goes on
from the ledger (rows, status, the end), which is where everything a client resumes from comes
from anyway (``Last-Event-ID`` is a row seq): only text deltas and tool calls are missed, and
their text is in the rows. The run is never slowed by a slow reader.
"""

from __future__ import annotations

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from tether.events import RunEvent, Subscriber

__all__ = ["LIVE_BUFFER", "LiveHub", "Subscription"]

LIVE_BUFFER = 1024
"""Live events one subscriber may have waiting (a streamed answer sends one per text chunk)."""


class Subscription:
    """One event stream's live tail of one run. Created by :meth:`LiveHub.subscribe`; the stream
    must :meth:`close` it when it ends."""

    def __init__(self, hub: LiveHub, run: str, buffer: int) -> None:
        self.run = run
        self._hub = hub
        self._send: MemoryObjectSendStream[RunEvent]
        self._receive: MemoryObjectReceiveStream[RunEvent]
        self._send, self._receive = anyio.create_memory_object_stream[RunEvent](buffer)
        self._first: list[RunEvent] = []
        self.overflowed = False
        """The hub dropped it: its buffer was full."""
        self.ended = False
        """No more live events will come through it (the run ended here, or it overflowed)."""

    def _offer(self, event: RunEvent) -> bool:
        """Buffer ``event``; False when the buffer is full (the hub then drops this one)."""
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.overflowed = True
            self._send.close()
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    def _finish(self) -> None:
        self._send.close()

    @property
    def buffered(self) -> int:
        """Events waiting in this subscriber's buffer."""
        return self._receive.statistics().current_buffer_used + len(self._first)

    def take(self) -> list[RunEvent]:
        """Every event buffered now, oldest first (never waits)."""
        out, self._first = self._first, []
        while True:
            try:
                out.append(self._receive.receive_nowait())
            except anyio.WouldBlock:
                return out
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                self.ended = True
                return out

    async def wait(self, seconds: float) -> None:
        """Until an event is buffered or ``seconds`` pass (just the wait once ended)."""
        if self.ended or self._first:
            if self.ended:
                await anyio.sleep(seconds)
            return
        with anyio.move_on_after(seconds):
            try:
                self._first.append(await self._receive.receive())
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                self.ended = True

    def close(self) -> None:
        self._hub._forget(self)
        self._send.close()
        self._receive.close()


class LiveHub:
    """Runs executed by this process's workers publish here; event streams of this process
    subscribe. Streams of another process read the ledger only (rows, status)."""

    def __init__(self, buffer: int = LIVE_BUFFER) -> None:
        self.buffer = buffer
        self._live: set[str] = set()
        self._subscribers: dict[str, set[Subscription]] = {}

    def publisher(self, run: str) -> Subscriber:
        """The run's event subscriber, for the worker executing it."""
        self._live.add(run)

        def publish(event: RunEvent) -> None:
            for sub in list(self._subscribers.get(run, ())):
                if not sub._offer(event):
                    self._forget(sub)

        return publish

    def done(self, run: str) -> None:
        """The run ended here (or was handed over): its subscribers get no more live events."""
        self._live.discard(run)
        for sub in self._subscribers.pop(run, set()):
            sub._finish()

    def subscribe(self, run: str) -> Subscription:
        """A new subscriber to ``run``'s live events from now on (whether or not a worker of
        this process holds the run yet)."""
        sub = Subscription(self, run, self.buffer)
        self._subscribers.setdefault(run, set()).add(sub)
        return sub

    def _forget(self, sub: Subscription) -> None:
        subs = self._subscribers.get(sub.run)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subscribers[sub.run]

    def holds(self, run: str) -> bool:
        return run in self._live

    def live(self) -> list[str]:
        """The runs this process's workers hold."""
        return list(self._live)

    def held_events(self) -> int:
        """Events the hub holds now, over every subscriber (each at most ``buffer``)."""
        return sum(sub.buffered for subs in self._subscribers.values() for sub in subs)

    def subscribers(self, run: str) -> int:
        return len(self._subscribers.get(run, ()))
