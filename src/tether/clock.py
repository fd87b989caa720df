"""Time, injectable: the harness reads deadlines through a ``Clock`` so tests can drive them.

``SystemClock`` is anyio's monotonic loop clock. ``ManualClock`` moves only when told to, so a
deadline test takes milliseconds whatever the deadline; a test waits for the code under test to
be asleep on it (``await clock.sleepers(n)``) before it moves it.
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


async def sleep(clock: Clock, seconds: float) -> None:
    """``seconds`` on ``clock`` (cancellable)."""
    await clock.sleep_until(clock.now() + seconds)


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
        self._changed = anyio.Event()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, when: float) -> None:
        if when <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        entry = (when, next(self._order), event)
        heapq.heappush(self._sleepers, entry)
        self._wake_watchers()
        try:
            await event.wait()
        finally:
            if not event.is_set():  # cancelled: no longer asleep here
                self._sleepers.remove(entry)
                heapq.heapify(self._sleepers)
                self._wake_watchers()

    @property
    def asleep(self) -> int:
        """How many tasks sleep on this clock now."""
        return len(self._sleepers)

    async def sleepers(self, n: int = 1, *, at: float | None = None) -> None:
        """Wait until at least ``n`` tasks sleep on this clock (``at``: until that very time,
        such as a run's deadline), so that an :meth:`advance` after it reaches them."""
        while sum(1 for when, _, _ in self._sleepers if at is None or when == at) < n:
            await self._changed.wait()

    def _wake_watchers(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def advance(self, seconds: float) -> None:
        self._now += seconds
        woke = False
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()
            woke = True
        if woke:
            self._wake_watchers()
