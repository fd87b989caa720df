"""Stopping a run: why it stopped (``StopReason``, recorded on the run) and the handle that asks
for a stop (``StopControl``).

A soft stop (an operator's, or the deadline's) sends pi ``abort`` and waits, up to a grace
period, for pi to settle; a hard stop kills pi's process group at once and cancels the run's
work scope. A soft stop that does not see pi settle in time escalates to a hard one.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from tether.clock import Clock

__all__ = ["StopControl", "StopReason", "race_clock"]

T = TypeVar("T")


class StopReason(enum.StrEnum):
    SETTLED = "settled"
    """pi settled on its own: the run finished, or failed at the provider."""
    DEADLINE = "deadline"
    """The agent's deadline passed (a soft stop)."""
    SOFT_STOP = "soft_stop"
    """Someone asked the run to stop (abort, then wait for pi to settle)."""
    HARD_STOP = "hard_stop"
    """Someone stopped the run at once (pi's process group was killed)."""
    ESCALATED = "escalated"
    """pi was killed because a stop did not see it settle in time (recorded as ``escalated``
    beside the first reason)."""
    TRANSPORT_LOST = "transport_lost"
    """pi's stdio closed mid-run (it exited, crashed or was killed from outside)."""
    STARTUP_FAILED = "startup_failed"
    """pi did not start, or did not accept the prompt."""
    PROTOCOL_ERROR = "protocol_error"
    """pi's output broke the protocol."""
    FENCED_OUT = "fenced_out"
    """Another owner claimed the run; this harness stopped writing."""


class StopControl:
    """Ask a run to stop. Create it inside the event loop; call from the same loop (or through
    ``anyio.from_thread.run_sync``)."""

    def __init__(self) -> None:
        self.reason: StopReason | None = None
        self.hard = False
        self.escalated = False
        self.soft_requested = anyio.Event()
        self.hard_requested = anyio.Event()

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def soft(self, reason: StopReason = StopReason.SOFT_STOP) -> None:
        if self.reason is None:
            self.reason = reason
        self.soft_requested.set()

    def stop_hard(self, reason: StopReason = StopReason.HARD_STOP) -> None:
        if self.reason is None:
            self.reason = reason
        self.hard = True
        self.soft_requested.set()
        self.hard_requested.set()

    def escalate(self) -> None:
        """A soft stop did not see pi settle in time: kill it (the first reason is kept)."""
        self.escalated = True
        self.stop_hard(StopReason.ESCALATED)


async def race_clock(
    clock: Clock, deadline: float, fn: Callable[[], Awaitable[T]]
) -> tuple[bool, T | None]:
    """Run ``fn`` until it returns or ``clock`` reaches ``deadline``: (finished, result)."""
    result: list[T] = []
    async with anyio.create_task_group() as tg:

        async def work() -> None:
            result.append(await fn())
            tg.cancel_scope.cancel()

        async def timer() -> None:
            await clock.sleep_until(deadline)
            tg.cancel_scope.cancel()

        tg.start_soon(work)
        tg.start_soon(timer)
    return (True, result[0]) if result else (False, None)
