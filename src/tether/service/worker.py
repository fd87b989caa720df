"""Workers (docs/contracts.md#the-http-api): claim queued runs oldest first, at most one live run
per session,
execute each exactly as ``tether run`` does, relay ``steer``/``follow_up`` requests into the runs
they hold, and reconcile expired leases.

    worker = Worker(ledger, config, concurrency=4)
    await worker.run()          # until worker.stop() (SIGTERM, a cancel, an admin drain)

The ledger is the queue (``claim_next``: FIFO, ``FOR UPDATE SKIP LOCKED``-like on PostgreSQL)
and the fence orders owners; a worker holds no state another could not rebuild from it.

Stopping (procrastinate's shape): :meth:`Worker.stop` only sets a flag and wakes the loop; the
loop stops claiming and lets live runs finish until ``[service] drain_s``; runs still live then
are *handed over*: their leases are expired, so the next worker's reconcile takes them
(docs/architecture.md#custody:
pi runs under its keeper, so it resumes on the same pi), and ``on_handover`` ends the process
without ending them (``tether worker`` and ``tether serve`` exit there), instead of killing pi.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import anyio

from tether.config import Config
from tether.errors import FencedOut, LedgerError, RunNotActive, TetherError
from tether.events import Subscriber
from tether.harness import (
    StopControl,
    StopReason,
    continuation_checkpoint,
    run_claimed,
)
from tether.harness.custody.erasing import retention_stopping
from tether.harness.custody.placement import owner_id
from tether.harness.custody.reconcile import reconcile
from tether.harness.relay import Deliver, LivePi
from tether.ledger import Fence, Ledger, RunStatus
from tether.pi.install import PiInstall
from tether.service.hub import LiveHub
from tether.service.limits import live_bound
from tether.service.metrics import Metrics
from tether.service.webhooks import Deliverer
from tether.threads import in_thread

__all__ = ["Worker"]

log = logging.getLogger(__name__)
RELAYED = (Deliver.STEER.value, Deliver.FOLLOW_UP.value)
RETENTION_ACTOR = "tether:retention"
"""The actor retention's erasure receipts name."""
RETENTION_EVERY_S = 86_400.0
RELAY_POLL_S = 0.5
"""How often a live run's relay asks the ledger for requests queued by another process (at
least ``[service] poll_s``); a request posted to this process wakes it at once."""


class Worker:
    def __init__(
        self,
        ledger: Ledger,
        config: Config,
        *,
        concurrency: int = 1,
        owner: str | None = None,
        hub: LiveHub | None = None,
        metrics: Metrics | None = None,
        pi: PiInstall | None = None,
        on_handover: Callable[[list[Fence]], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("a worker needs a concurrency of at least 1")
        self.ledger = ledger
        self.config = config
        self.concurrency = concurrency
        self.owner = owner or owner_id()
        self.hub = hub
        self.metrics = metrics
        self.pi = pi
        self.on_handover = on_handover
        """Called with the runs still live at the drain deadline, after their leases were
        expired; it should end the process at once (``os._exit``) so nothing ends them. Without
        it they are stopped (abort, settle) and end ``interrupted``, their answers kept."""
        self.live: dict[str, tuple[Fence, StopControl]] = {}
        self.handed_over: list[Fence] = []
        self.executed = 0
        self._stopping = False
        self._signals = 0
        """Bumped by every :meth:`notify`, finished run and stop: a loop that saw it change
        while it looked at the ledger looks again instead of sleeping (no wake-up is lost)."""
        self._wake: anyio.Event | None = None
        self._stopped_event: anyio.Event | None = None
        self._relays: dict[str, _Poke] = {}
        """The sessions whose live runs this worker relays into (one each, while relaying)."""
        self._live_limit = live_bound(config)

    @property
    def lease_s(self) -> float:
        return self.config.custody.lease_s

    def stop(self) -> None:
        """Stop claiming; live runs go on until the drain deadline. Safe before ``run``."""
        self._stopping = True
        self._signal()
        if self._stopped_event is not None:
            self._stopped_event.set()

    def notify(self, relay: str | None = None) -> None:
        """A request was queued by this process. An idle worker claims at once instead of at
        its next poll; a busy one claims at its poll or when a run ends: claiming and starting
        a run on every post of a burst put that work right under the next posts (their p99
        went from 13 to 40 ms in one bench/service.py run) for no sooner end. ``relay``: it
        was marked for relay into that session's live run, whose relay looks at once (only
        that one: a look is a ledger read, and a plain request needs none). Call it from the
        event loop the worker runs on. Requests queued elsewhere are found by polling."""
        if relay is not None and relay in self._relays:
            self._relays[relay].poke()
        if not self.live:
            self._signal()

    def _signal(self) -> None:
        self._signals += 1
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    @property
    def _stopped(self) -> anyio.Event:
        if self._stopped_event is None:
            self._stopped_event = anyio.Event()
            if self._stopping:
                self._stopped_event.set()
        return self._stopped_event

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def _idle(self, seconds: float, seen: int | None = None) -> None:
        """Wait for ``seconds``, a notice, a finished run, or a stop, whichever comes first;
        at once when one came since ``seen`` (``self._signals`` when the caller last looked)."""
        if (self._stopping and not self.live) or (seen is not None and seen != self._signals):
            return
        if self._wake is None:
            self._wake = anyio.Event()
        with anyio.move_on_after(seconds):
            await self._wake.wait()

    async def run(self) -> list[Fence]:
        """Claim and execute runs until stopped; returns the runs handed over (still live at
        the drain deadline)."""
        poll = self.config.service.poll_s
        async with anyio.create_task_group() as runs:
            # A run resumed by the reconcile (docs/architecture.md#custody) is driven inside it: it
            # finishes before the
            # worker returns.
            runs.start_soon(self._reconcile_loop)
            # Run ends to [service.webhooks] (tether.service.webhooks), until the stop.
            deliverer = Deliverer(self.ledger, self.config, owner=self.owner)
            runs.start_soon(deliverer.run, self._stopped)
            if self.config.retention.idle_days is not None:
                runs.start_soon(self._retention_loop, self.config.retention.idle_days)
            while not self._stopping:
                if len(self.live) >= self.concurrency:
                    await self._idle(poll)
                    continue
                seen = self._signals
                try:
                    # No more of an actor's runs live than its [service.limits] live.
                    fence = await in_thread(
                        self.ledger.claim_next,
                        owner=self.owner,
                        lease_s=self.lease_s,
                        live_limit=self._live_limit,
                    )
                except LedgerError as exc:
                    log.warning("claiming a run failed (%s); trying again", exc)
                    await self._idle(poll * 5)
                    continue
                if fence is None:
                    await self._idle(poll, seen)
                    continue
                self.live[fence.run] = (fence, StopControl())
                runs.start_soon(self._execute, fence)
            await self._drain()
        return self.handed_over

    async def _drain(self) -> None:
        with anyio.move_on_after(self.config.service.drain_s):
            while self.live:
                await self._idle(self.config.service.poll_s)
        if not self.live:
            return
        # Hand over: expire the leases, so the next reconcile (here or on another host) takes
        # the runs; this process must then exit without ending them (see the module docstring).
        for fence, _ in list(self.live.values()):
            with contextlib.suppress(TetherError):
                await in_thread(self.ledger.heartbeat, fence, lease_s=0.0)
            self.handed_over.append(fence)
        log.warning(
            "handing over %d live run(s) at the drain deadline: %s",
            len(self.handed_over),
            ", ".join(f.run for f in self.handed_over),
        )
        if self.on_handover is not None:
            self.on_handover(list(self.handed_over))
        for _, stop in list(self.live.values()):
            stop.soft(StopReason.SOFT_STOP, "the worker stopped at its drain deadline")

    async def _execute(self, fence: Fence) -> None:
        _, stop = self.live[fence.run]
        subscribers: list[Subscriber] = []
        if self.hub is not None:
            subscribers.append(self.hub.publisher(fence.run))
        try:
            outcome = await run_claimed(
                self.ledger,
                self.config,
                fence,
                stop=stop,
                subscribers=subscribers,
                checkpoint=continuation_checkpoint,
                pi=self.pi,
                relay=self._relay,
                budgeted=True,  # [service.budgets] (tether.service.budgets)
            )
            if self.metrics is not None:
                self.metrics.worker_runs[outcome.status.value] += 1
                self.metrics.checkpoints[outcome.checkpoint.label] += 1
        except Exception as exc:
            # Refused or misconfigured before pi started (or a bug): the claimed run must still
            # end, and the worker goes on with its other runs.
            if isinstance(exc, TetherError):
                log.warning("run %s could not run: %s", fence.run, exc)
            else:
                log.exception("run %s failed in the harness", fence.run)
            with anyio.CancelScope(shield=True), contextlib.suppress(FencedOut, RunNotActive):
                await in_thread(
                    self.ledger.end_run,
                    fence,
                    RunStatus.FAILED,
                    extra={"error": str(exc), "stop_reason": "refused"},
                )
            if self.metrics is not None:
                self.metrics.worker_runs[RunStatus.FAILED.value] += 1
        finally:
            self.executed += 1
            if self.hub is not None:
                self.hub.done(fence.run)
            self.live.pop(fence.run, None)
            self._signal()

    async def _relay(self, live: LivePi) -> None:
        """While the run's task turn is live: deliver the session's queued requests marked
        ``steer``/``follow_up`` into it, oldest first; each is then ended as delivered (its row
        is the user message pi writes, with the sender's actor). It looks when this process
        marks a request for relay into the session (:meth:`notify`), and every
        :data:`RELAY_POLL_S` for requests queued by other processes: each look is a ledger read
        in a thread, so a fast poll per live run would cost the event loop (and so every run)
        more than the requests it finds."""
        poll = max(self.config.service.poll_s, RELAY_POLL_S)
        poke = self._relays[live.session] = _Poke()
        try:
            await self._relay_into(live, poke, poll)
        finally:
            if self._relays.get(live.session) is poke:
                del self._relays[live.session]

    async def _relay_into(self, live: LivePi, poke: _Poke, poll: float) -> None:
        while True:
            seen = poke.count
            for queued in await in_thread(self.ledger.queued_runs, live.session, limit=100):
                how = queued.extra.get("deliver")
                request: dict[str, Any] = queued.extra.get("request") or {}
                if how not in RELAYED or queued.agent != live.agent or not request:
                    continue
                if not await live.deliver(Deliver(how), request["text"], request["actor"]):
                    return  # the turn settled: it stays queued, the session's next run
                await in_thread(
                    self.ledger.end_queued_run,
                    queued.id,
                    RunStatus.FINISHED,
                    extra={"delivered_into": live.run, "deliver": how},
                )
            await poke.wait(poll, seen)

    async def _retention_loop(self, idle_days: int) -> None:
        """Erase sessions idle for ``[retention] idle_days``
        (docs/operations.md#erasure-and-retention), at start and then
        once a day (every worker does: the second finds nothing left to erase)."""
        while not self._stopping:
            try:
                done = await retention_stopping(
                    self.ledger, self.config, idle_days, actor=RETENTION_ACTOR
                )
            except TetherError as exc:
                log.warning("applying retention failed (%s); trying again in a day", exc)
            else:
                for d in done:
                    log.info("retention erased session %s", d.plan.sessions[0])
            with anyio.move_on_after(RETENTION_EVERY_S):
                await self._stopped.wait()

    async def _reconcile_loop(self) -> None:
        """Reconcile expired leases (docs/architecture.md#custody) every third of a lease."""
        while not self._stopping:
            try:
                done = await reconcile(self.ledger, self.config, pi=self.pi, relay=self._relay)
            except TetherError as exc:
                log.warning("reconciling expired leases failed (%s); trying again", exc)
            else:
                for found in done:
                    log.info("reconciled run %s: %s", found.run, found.resolution)
            with anyio.move_on_after(min(self.lease_s / 3, 5.0)):
                await self._stopped.wait()


class _Poke:
    """A wake-up that is never lost: ``wait`` returns at once when ``poke`` came since the
    waiter's last look (``count`` then)."""

    def __init__(self) -> None:
        self.count = 0
        self._event: anyio.Event | None = None

    def poke(self) -> None:
        self.count += 1
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, seconds: float, seen: int) -> None:
        if seen != self.count:
            return
        if self._event is None:
            self._event = anyio.Event()
        with anyio.move_on_after(seconds):
            await self._event.wait()
