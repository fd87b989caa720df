"""Riding out a ledger that cannot be written (a full disk, a lost connection): a run does not
stop pi for it. A write is tried again, a pause apart on the run's clock, for up to
``harness.storage_retry_s``; every try again is counted (the run's ``storage_retries``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tether.clock import Clock, sleep
from tether.errors import StorageError

__all__ = ["PAUSE_S", "StorageRetry"]

T = TypeVar("T")

PAUSE_S = 0.5
"""Between two tries of a ledger write that failed."""


class StorageRetry:
    def __init__(self, clock: Clock, retry_s: float) -> None:
        self.clock = clock
        self.retry_s = retry_s
        self.retries = 0
        """Ledger writes that failed and were tried again."""

    def failed(self) -> None:
        """A write failed and will be tried again later by its caller (a heartbeat, a pass)."""
        self.retries += 1

    async def pause(self) -> None:
        """A write failed: count it and wait before the next try."""
        self.retries += 1
        await sleep(self.clock, PAUSE_S)

    async def retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` again while the ledger cannot be written, up to ``retry_s``; then the last
        ``StorageError`` is raised."""
        deadline = self.clock.now() + self.retry_s
        while True:
            try:
                return await call()
            except StorageError:
                if self.clock.now() + PAUSE_S > deadline:
                    raise
                await self.pause()
