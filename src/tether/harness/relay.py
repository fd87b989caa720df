"""Relay: requests delivered into a live run's pi (docs/contracts.md#the-http-api, ``deliver:
steer|follow_up``).

A run started with a ``relay`` hook hands it a :class:`LivePi` while its task turn is live; the
hook (the service's worker) pushes requests into pi with :meth:`LivePi.deliver`. When the turn
settles the hook is cancelled and the handle refuses further deliveries, so nothing is ever sent
into pi while the checkpoint runs (pi acknowledges, then drops a prompt sent during compaction);
the caller keeps such a request as the session's next queued run instead.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

import anyio

from tether.mirror.entries import Actors
from tether.pi.client import RpcClient
from tether.pi.errors import TransportClosed
from tether.pi.protocol import Command

__all__ = ["Deliver", "LivePi", "RelayHook"]


class Deliver(enum.StrEnum):
    """How a request reaches a session (the ``deliver`` field of a request)."""

    QUEUE = "queue"
    """The session's next queued run."""
    STEER = "steer"
    """Into the live run, after its current tool calls (pi's ``steer``)."""
    FOLLOW_UP = "follow_up"
    """Into the live run, once it would otherwise stop (pi's ``follow_up``)."""


class LivePi:
    """A live run's pi, as a relay may use it: only while the task turn is live."""

    def __init__(self, client: RpcClient, actors: Actors, *, run: str, session: str) -> None:
        self._client = client
        self._actors = actors
        self._lock = anyio.Lock()
        self.run = run
        self.session = session
        self.agent = actors.agent
        self.open = True

    def close(self) -> None:
        self.open = False

    async def deliver(self, how: Deliver, text: str, actor: str) -> bool:
        """Send ``text`` into pi as ``steer`` or ``follow_up``; the row pi writes for it carries
        ``actor``. False when the turn has settled (or pi refused it): nothing was delivered."""
        if how is Deliver.QUEUE:
            raise ValueError("a queued request is not delivered into a live run")
        async with self._lock:
            if not self.open:
                return False
            self._actors.relayed[text] = actor
            command = Command.STEER if how is Deliver.STEER else Command.FOLLOW_UP
            try:
                response = await self._client.request(command, message=text)
            except TransportClosed:
                self._actors.relayed.pop(text, None)
                return False
            if not response.success:
                self._actors.relayed.pop(text, None)
            return response.success


RelayHook = Callable[[LivePi], Awaitable[None]]
"""Runs while the task turn is live; cancelled when it settles."""
