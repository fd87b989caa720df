"""Stopping a run: why it stopped (``StopReason``), the value a stop leaves (``Stopped``), the
handle that asks for one (``StopControl``), and the scopes it cancels.

A stop is a cancel scope, not a flag. The run's task turn is nested as

    hard scope       cancelled by a hard stop (or an escalation): pi is killed
      soft scope     cancelled by a soft stop or the deadline: pi gets ``abort`` and a grace
                     period to settle; if it does not, the stop escalates to the hard scope

and whichever scope caught the cancellation says what the stop was. ``StopControl`` may be asked
before the run has entered its scopes (a stop that lands before the loop starts) or after it has
left them (a late stop changes nothing that already happened).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio
import msgspec

from tether.clock import Clock

__all__ = ["StopControl", "StopReason", "Stopped", "race_clock"]

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
    STORAGE_ERROR = "storage_error"
    """The ledger could not be written for longer than ``harness.storage_retry_s`` (a full disk,
    a revoked permission, a server that stayed away); the answer is kept in pi's session file."""
    TURN_LIMIT = "turn_limit"
    """The run took more turns than ``[agents.X] max_turns`` (a soft stop,
    :mod:`tether.harness.bounds`)."""
    TOOL_CALL_LIMIT = "tool_call_limit"
    """The run made more tool calls than ``[agents.X] max_tool_calls`` (a soft stop)."""
    REPEATED_TOOL_CALL = "repeated_tool_call"
    """The run called one tool with the same arguments more than ``[agents.X]
    max_repeated_tool_calls`` times in a row (a soft stop)."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """The actor's usage of the day crossed its ``[service.budgets]`` (a soft stop,
    :mod:`tether.harness.usage`)."""

    @property
    def is_soft(self) -> bool:
        """A stop that asks pi to abort and settle (rather than killing it)."""
        return self in (
            StopReason.SOFT_STOP,
            StopReason.DEADLINE,
            StopReason.TURN_LIMIT,
            StopReason.TOOL_CALL_LIMIT,
            StopReason.REPEATED_TOOL_CALL,
            StopReason.BUDGET_EXHAUSTED,
        )


class Stopped(msgspec.Struct, frozen=True):
    """What a stop came to: the value that ends a turn."""

    reason: StopReason
    hard: bool
    escalated: bool = False
    detail: str | None = None
    """Why, in words (a fenced-out write, pi's protocol breach, an escalation)."""

    @classmethod
    def fenced(cls, exc: BaseException) -> Stopped:
        """Another owner took the run over: this harness must stop writing."""
        return cls(StopReason.FENCED_OUT, hard=True, detail=str(exc))

    @property
    def is_failure(self) -> bool:
        """The harness stopped the run because it could not go on (not someone's stop)."""
        return self.reason in (
            StopReason.PROTOCOL_ERROR,
            StopReason.FENCED_OUT,
            StopReason.STORAGE_ERROR,
        )


class StopControl:
    """Ask a run to stop: ``soft()`` (abort, let pi settle) or ``stop_hard()`` (kill pi now).

    Create it inside the event loop; call it from the same loop (a signal handler task, the CLI,
    a worker), or through ``anyio.from_thread.run_sync``. The first reason asked for is kept.
    """

    def __init__(self) -> None:
        self.reason: StopReason | None = None
        self.detail: str | None = None
        self.hard = False
        self.escalated = False
        self.soft_requested = anyio.Event()
        self.hard_requested = anyio.Event()
        self._soft_scopes: list[anyio.CancelScope] = []
        self._hard_scopes: list[anyio.CancelScope] = []

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def soft(self, reason: StopReason = StopReason.SOFT_STOP, detail: str | None = None) -> None:
        if self.reason is None:
            self.reason, self.detail = reason, detail
        self.soft_requested.set()
        for scope in self._soft_scopes:
            scope.cancel()

    def stop_hard(
        self, reason: StopReason = StopReason.HARD_STOP, detail: str | None = None
    ) -> None:
        if self.reason is None:
            self.reason, self.detail = reason, detail
        self.hard = True
        self.soft_requested.set()
        self.hard_requested.set()
        for scope in (*self._soft_scopes, *self._hard_scopes):
            scope.cancel()

    def escalate(self) -> None:
        """A soft stop did not see pi settle in time: kill it (the first reason is kept)."""
        self.escalated = True
        self.stop_hard(StopReason.ESCALATED)

    def value(self) -> Stopped:
        """The stop asked for so far, as a value (only meaningful once ``requested``)."""
        return Stopped(
            reason=self.reason or StopReason.HARD_STOP,
            hard=self.hard,
            escalated=self.escalated,
            detail=self.detail,
        )

    @contextmanager
    def scope(self, *, hard: bool) -> Iterator[anyio.CancelScope]:
        """A cancel scope this control cancels: a soft one by any stop, a hard one only by a
        hard stop. A stop asked for earlier cancels it on entry."""
        scopes = self._hard_scopes if hard else self._soft_scopes
        with anyio.CancelScope() as scope:
            if self.hard or (not hard and self.requested):
                scope.cancel()
            scopes.append(scope)
            try:
                yield scope
            finally:
                scopes.remove(scope)


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
