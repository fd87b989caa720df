"""The helper tasks that run beside a run's task turn (:mod:`tether.harness.driver` starts
them): the heartbeat, mirroring as pi writes, the deadline, the stop's announcement, the kill
on a hard stop, and the relay of live requests. The driver guards the ones that can fail: a
failure stops pi and is reported, never lost."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from tether.clock import Clock, sleep
from tether.errors import LedgerError, StorageError
from tether.events import EventBus, StopRequested
from tether.harness.context import ClaimedRun
from tether.harness.custody import placement as custody_place
from tether.harness.relay import LivePi, RelayHook
from tether.harness.stops import StopControl, StopReason
from tether.harness.storage import StorageRetry
from tether.mirror.mirror import Mirror
from tether.pi.transport import AgentTransport
from tether.threads import in_thread

__all__ = [
    "announce_stop",
    "heartbeat",
    "keep_mirroring",
    "kill_on_hard_stop",
    "relay",
    "watch_deadline",
    "watch_stop_requests",
]

STOP_POLL_S = 1.0
"""How often a run reads whether a stop was asked of it through the ledger (an erasure's, from
any process or host): one primary-key read. Real time, not the run's clock: it is a poll, not a
deadline."""

log = logging.getLogger(__name__)


async def kill_on_hard_stop(
    stop: StopControl, transport: AgentTransport, handed_over: Callable[[], Awaitable[bool]]
) -> None:
    """Lives through pi's orderly close too: a second Ctrl-C there kills at once. Whatever
    the stop, a pi a newer owner holds is left to it (``handed_over`` asks the ledger)."""
    await stop.hard_requested.wait()
    if await handed_over():
        return
    if stop.reason is StopReason.FENCED_OUT:
        # A fenced-out write, and the ledger could not say who holds the run now: never
        # signal a pi the newer owner can take over.
        await transport.fenced_out()
        return
    await transport.kill()


async def heartbeat(
    run: ClaimedRun, transport: AgentTransport, clock: Clock, storage: StorageRetry
) -> None:
    """Keep the lease and record where pi runs (docs/architecture.md#custody); a lost lease fences
    the run
    out (the helper's failure stops it, without touching pi)."""
    where = custody_place.placement(pi=transport.pi_placement(), run_dir=run.run_dir)
    lease_s = run.config.custody.lease_s
    while True:
        try:
            await in_thread(run.ledger.heartbeat, run.fence, lease_s=lease_s, placement=where)
        except StorageError:
            # A ledger that cannot be written does not stop pi (the mirror rides it out):
            # the lease lasts lease_s, and the next beat, a third of it later, tries again.
            storage.failed()
        await sleep(clock, lease_s / 3)


async def keep_mirroring(mirror: Mirror, storage: StorageRetry) -> None:
    """Mirror as pi writes. A ledger that cannot be written does not stop pi: the entries
    stay in pi's session file, and the next pass (or the final one) writes them."""
    while True:
        try:
            await mirror.run()
        except StorageError:
            await storage.pause()


async def watch_deadline(clock: Clock, deadline: float, stop: StopControl) -> None:
    await clock.sleep_until(deadline)
    stop.soft(StopReason.DEADLINE)


async def watch_stop_requests(run: ClaimedRun, stop: StopControl) -> None:
    """Stop the run when a stop is asked of it through the ledger (``tether erase`` from any
    process: :mod:`tether.ledger.erasing`): a soft request as a soft stop, a hard one as a hard
    stop, with the request's words as the stop's detail (the run's record keeps them)."""
    while True:
        try:
            asked = await in_thread(run.ledger.stop_request, run.fence)
        except LedgerError:
            asked = None  # the ledger is away: the next poll asks again (pi goes on)
        if asked is not None:
            if asked.hard and not stop.hard:
                stop.stop_hard(StopReason.HARD_STOP, asked.detail)
            elif not stop.requested:
                stop.soft(StopReason.SOFT_STOP, asked.detail)
        await anyio.sleep(STOP_POLL_S)


async def announce_stop(stop: StopControl, bus: EventBus) -> None:
    await stop.soft_requested.wait()
    bus.emit(StopRequested(reason=str(stop.reason), hard=stop.hard))


async def relay(hook: RelayHook, live: LivePi, scope: anyio.CancelScope, run_id: str) -> None:
    """The relay hook, while the turn is live; its failure loses a delivery, not the run."""
    with scope:
        try:
            await hook(live)
        except Exception:
            log.exception("the relay of run %s failed; the run goes on", run_id)
