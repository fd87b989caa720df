"""Admission and queueing (docs/cli.md#tether-run step 1, docs/architecture.md#custody): a request
is checked before anything is
written, queued behind its session's live run (one live run per session, FIFO), and claimed
when its turn comes; whoever touches a session reconciles its lapsed leases first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import anyio
import msgspec

from tether.admission import admit_request
from tether.clock import Clock
from tether.config import Config
from tether.errors import HarnessError, LedgerError, SessionBusy, SessionRefusing
from tether.events import EventBus, Subscriber, Waiting
from tether.harness.claimed import run_claimed, start_pi
from tether.harness.custody import placement as custody_place
from tether.harness.custody.reconcile import reconcile
from tether.harness.prepare import followup_view
from tether.harness.relay import RelayHook
from tether.harness.rundir import runs_dir
from tether.harness.stops import StopControl
from tether.harness.traces import queued_context
from tether.harness.turn import CheckpointStep, RunOutcome, RunRequest
from tether.ids import new_run_id
from tether.ledger import Fence, Ledger
from tether.pi.agentdir import provider_keys
from tether.pi.install import PiInstall, find_pi
from tether.pi.launch import PiLaunch
from tether.pi.workspace import run_workdir
from tether.threads import in_thread

__all__ = ["execute_run"]


async def execute_run(
    ledger: Ledger,
    config: Config,
    request: RunRequest,
    *,
    clock: Clock | None = None,
    stop: StopControl | None = None,
    subscribers: Sequence[Subscriber] = (),
    checkpoint: CheckpointStep | None = None,
    pi: PiInstall | None = None,
    wait: bool = True,
    relay: RelayHook | None = None,
    launch: PiLaunch | None = None,
) -> RunOutcome:
    """Run one task turn. Raises ``ConfigError``, ``PiNotInstalled``, ``SessionRefusing``,
    ``Refused`` or (``wait=False``, the session busy) ``SessionBusy`` before anything is
    written; every later failure ends the run (failed or interrupted, with its reason) and is
    reported in the outcome.

    The request is admitted (the agent, its provider key, its workdir, the view), queued behind
    the session's live run (docs/architecture.md#custody: one live run per session, FIFO; expired
    leases on the
    session are reconciled first), and run when its turn comes (:func:`run_claimed`).

    ``launch``: pi already started for this request (``PiLaunch.start`` with the request's
    ``run_id``, as ``tether run`` does before it imports the harness). Without one, pi is started
    here, once the request is admitted (with custody). Either way it loads, held at its gate,
    while the request is queued and the run's rows and session file are written, and is
    discarded if the run never starts."""
    try:  # a launch given or made here is discarded if the run never starts
        config.agent(request.agent)
        admit_request(request.text, config.followup)  # before any write (docs/cli.md#tether-run)
        provider_keys(config, request.agent)  # a missing key refuses before any write
        # The session's workspace, made at its first run (a copy takes the template's time).
        workdir = await in_thread(
            lambda: run_workdir(
                config,
                request.agent,
                request.session,
                ledger_path=ledger.path,
                workdir=request.workdir,
            )
        )
        pi = pi or find_pi()
        if launch is not None and launch.run_id != request.run_id:
            raise ValueError(f"pi was launched for run {launch.run_id}, not {request.run_id}")
        if (
            launch is None
            and config.custody.detached
            and await in_thread(ledger.session_free, request.session)
        ):
            request = msgspec.structs.replace(request, run_id=request.run_id or new_run_id())
            # A failure to start it here is met again, and reported, when the run is claimed.
            launch, _ = start_pi(
                config, request, pi=pi, run_id=str(request.run_id), workdir=workdir
            )
        stop = stop or StopControl()
        fence = await _queue(
            ledger, config, request, bus=EventBus(list(subscribers)), wait=wait, stop=stop
        )
        return await run_claimed(
            ledger,
            config,
            fence,
            stop=stop,
            subscribers=subscribers,
            checkpoint=checkpoint,
            clock=clock,
            pi=pi,
            request=request,
            relay=relay,
            launch=launch,
        )
    finally:
        if launch is not None and not launch.released:
            # The session refusing, busy or its view refused, the wait withdrawn, or a failure
            # before pi was let through: it read and wrote nothing; end it and its directory.
            with anyio.CancelScope(shield=True):
                await in_thread(launch.discard, config.harness.stop_grace_s)


async def _queue(
    ledger: Ledger,
    config: Config,
    request: RunRequest,
    *,
    bus: EventBus,
    wait: bool,
    stop: StopControl,
) -> Fence:
    """Queue the request behind the session's live run and claim it when its turn comes."""
    session = await in_thread(ledger.ensure_session, request.session)
    # before touching it (docs/architecture.md#custody)
    await reconcile(ledger, config, session=request.session)
    if session.refusing:
        raise _refusing(session.id, session.refusing)
    # Admission: a view refused now writes nothing (the view is built again at the run's turn,
    # when it holds every earlier answer).
    await followup_view(ledger, config, request)
    if not wait:
        live = await in_thread(ledger.live_runs, session=request.session)
        queued = await in_thread(ledger.queued_runs, request.session, limit=1)
        if live or queued:
            raise SessionBusy(request.session, live[0].id if live else None)
    run, _ = await in_thread(
        ledger.enqueue_run,
        request.session,
        request.agent,
        actor=request.actor,
        text=request.text,
        run_id=request.run_id,
        waiter=custody_place.placement(pi=None, run_dir=runs_dir(config)),
    )
    stamp = queued_context(None)  # when it was queued, for the queue wait's span
    if stamp:
        await in_thread(ledger.update_queued_extra, run.id, stamp)
    try:
        return await _wait_turn(
            ledger, config, run.id, request.session, bus=bus, wait=wait, stop=stop
        )
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(LedgerError):
            await in_thread(ledger.cancel_queued, run.id)  # never started: withdraw it
        raise


def _refusing(session: str, why: str) -> SessionRefusing:
    return SessionRefusing(
        f"session {session!r} refuses new prompts: {why}; after checking "
        f"it, clear it with `tether session clear {session}`"
    )


async def _wait_turn(
    ledger: Ledger,
    config: Config,
    run_id: str,
    session: str,
    *,
    bus: EventBus,
    wait: bool,
    stop: StopControl,
) -> Fence:
    """Claim the run when it is first in its session's queue and the session is free; until
    then say which run it waits for, and reconcile the session whenever a lease has expired."""
    owner = custody_place.owner_id()
    announced: tuple[str | None, ...] | None = None
    while True:
        fence = await in_thread(
            ledger.claim_next, owner=owner, lease_s=config.custody.lease_s, run_id=run_id
        )
        if fence is not None:
            return fence
        live = await in_thread(ledger.live_runs, session=session)
        if not wait:
            raise SessionBusy(session, live[0].id if live else None)
        behind = live[0].id if live else None
        if announced != (behind,):
            announced = (behind,)
            bus.emit(Waiting(run=run_id, behind=behind, session=session))
        with anyio.move_on_after(config.custody.wait_poll_s):
            await stop.soft_requested.wait()
        if stop.requested:
            raise HarnessError(
                f"run {run_id} was withdrawn while it waited for run {behind} ({stop.reason}); "
                "nothing was written"
            )
        await reconcile(ledger, config, session=session)
        found = await in_thread(ledger.session, session)
        if found is not None and found.refusing:
            raise _refusing(session, found.refusing)
