"""What the service's routers share: the configuration, the ledger, the metrics, the live hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.config import Config
from tether.ledger import Ledger
from tether.service.hub import LiveHub
from tether.service.metrics import Metrics
from tether.service.paths import ServerPaths

__all__ = ["ServiceState", "service_of"]


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
    paths: ServerPaths = field(init=False)
    """The server's directories, which no answer names (tether.service.paths)."""

    def __post_init__(self) -> None:
        self.paths = ServerPaths.of(self.config)

    def queued(self, relay: str | None = None) -> None:
        """A request was queued (``relay``: marked for relay into that session's live run):
        this process's workers look at once."""
        for worker in self.workers:
            worker.notify(relay)


def service_of(app: Any) -> ServiceState:
    state: ServiceState = app.state.service
    return state
