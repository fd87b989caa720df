"""Time, injectable: the harness reads deadlines through a ``Clock`` so tests can drive them.

``SystemClock`` is anyio's monotonic loop clock. ``ManualClock`` moves only when told to, so a
deadline test takes milliseconds whatever the deadline.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol

import anyio

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Return once ``now() >= when`` (cancellable)."""
        ...


class SystemClock:
    def now(self) -> float:
        return anyio.current_time()

    async def sleep_until(self, when: float) -> None:
        await anyio.sleep_until(when)


class ManualClock:
    """A clock that advances only through :meth:`advance` (tests)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, when: float) -> None:
        if when <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        heapq.heappush(self._sleepers, (when, next(self._order), event))
        await event.wait()

    def advance(self, seconds: float) -> None:
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()
