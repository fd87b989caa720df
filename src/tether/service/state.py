"""What the service's routers share: the configuration, the ledger, the metrics, the live hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from tether.config import Config
from tether.events import RunEvent, Subscriber
from tether.ledger import Ledger
from tether.service.metrics import Metrics

__all__ = ["LiveHub", "ServiceState", "service_of"]


class _Channel:
    """One live run's events in this process (text deltas, tool calls, rows mirrored)."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self.changed = anyio.Event()
        self.closed = False

    def publish(self, event: RunEvent) -> None:
        self.events.append(event)
        self.changed.set()
        self.changed = anyio.Event()

    def close(self) -> None:
        self.closed = True
        self.changed.set()


class LiveHub:
    """Runs executed by this process's workers publish here; event streams of this process
    follow them. Streams of another process read the ledger only (rows, status)."""

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}

    def publisher(self, run: str) -> Subscriber:
        channel = self._channels.setdefault(run, _Channel())
        return channel.publish

    def done(self, run: str) -> None:
        channel = self._channels.pop(run, None)
        if channel is not None:
            channel.close()

    def channel(self, run: str) -> _Channel | None:
        return self._channels.get(run)

    def live(self) -> list[str]:
        return list(self._channels)


@dataclass
class ServiceState:
    config: Config
    ledger: Ledger
    metrics: Metrics = field(default_factory=Metrics)
    hub: LiveHub = field(default_factory=LiveHub)
    stopping: bool = False
    """Set when the service begins to stop: event streams end."""
    workers: list[Any] = field(default_factory=list)
    """The workers running inside this process (``tether serve --workers N``)."""


def service_of(app: Any) -> ServiceState:
    state: ServiceState = app.state.service
    return state
