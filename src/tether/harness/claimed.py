"""A claimed run, started (docs/cli.md#tether-run): its request, pi started ahead of it (custody),
its
follow-up view, and the driver that runs it to its end. A run refused now (the view, the
agent's key or workdir) ends ``failed`` before pi is let through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import anyio

from tether import telemetry
from tether.admission import Refused
from tether.clock import Clock, SystemClock
from tether.config import Config
from tether.errors import LedgerError
from tether.events import EventBus, RunStarted, Subscriber
from tether.harness.checkpoint import EXTENSION_PATH
from tether.harness.context import ClaimedRun, PiStart, RunControls
from tether.harness.custody import placement as custody_place
from tether.harness.driver import Driver
from tether.harness.ending import drive_recorded
from tether.harness.prepare import followup_view
from tether.harness.relay import RelayHook
from tether.harness.rundir import runs_dir
from tether.harness.stops import StopControl
from tether.harness.traces import RunTrace, run_trace
from tether.harness.turn import CheckpointStep, RunOutcome, RunRequest
from tether.images import IMAGES_KEY, image_parts
from tether.ledger import Fence, Ledger, RunStatus
from tether.ledger.usage import DayBudget
from tether.pi.agentdir import provider_keys
from tether.pi.install import PiInstall, find_pi
from tether.pi.launch import PiLaunch
from tether.pi.workspace import run_workdir
from tether.threads import in_thread

__all__ = ["queued_request", "run_claimed", "start_pi"]


def start_pi(
    config: Config, request: RunRequest, *, pi: PiInstall, run_id: str, workdir: Path
) -> tuple[PiLaunch | None, OSError | None]:
    """The run's pi, started now and held at its gate (custody); or why it could not start."""
    try:
        launch = PiLaunch.start(
            config,
            request.agent,
            pi=pi,
            run_id=run_id,
            workdir=workdir,
            extensions=request.extensions,
        )
    except OSError as exc:
        return None, exc
    return launch, None


def queued_request(
    run_id: str,
    session: str,
    agent: str,
    asked: object,
    *,
    checkpoint: bool,
    images: object = None,
) -> RunRequest:
    """The request a run was queued with (its ``extra["request"]``, and its images, the
    record's ``extra["images"]``), with the continuation extension when a checkpoint step is
    given."""
    fields = asked if isinstance(asked, dict) else {}
    return RunRequest(
        session=session,
        agent=agent,
        text=str(fields.get("text", "")),
        actor=str(fields.get("actor", "user:local")),
        run_id=run_id,
        extensions=(EXTENSION_PATH,) if checkpoint else (),
        images=tuple(image_parts(images)) if isinstance(images, list) else (),
    )


async def run_claimed(
    ledger: Ledger,
    config: Config,
    fence: Fence,
    *,
    stop: StopControl | None = None,
    subscribers: Sequence[Subscriber] = (),
    checkpoint: CheckpointStep | None = None,
    clock: Clock | None = None,
    pi: PiInstall | None = None,
    request: RunRequest | None = None,
    relay: RelayHook | None = None,
    launch: PiLaunch | None = None,
    budgeted: bool = False,
) -> RunOutcome:
    """Execute one claimed run exactly as ``tether run`` does: the view, the request row, pi,
    the mirror, the checkpoint, heartbeats, and the run's end. ``request`` defaults to the
    run's queued request (``extra["request"]``), with the continuation extension when a
    checkpoint step is given. A view refused now ends the run ``failed`` and raises.
    ``budgeted`` (the service's runs): the requesting actor's ``[service.budgets]`` bounds the
    run, stopped softly once the actor's usage of the day reaches it (tether.harness.usage)."""
    run = await in_thread(ledger.get_run, fence.run)
    if request is None:
        request = queued_request(
            run.id,
            run.session,
            run.agent,
            run.extra.get("request") or {},
            checkpoint=checkpoint is not None,
            images=run.extra.get(IMAGES_KEY),
        )
    agent = config.agent(request.agent)
    trace = await run_trace(
        ledger,
        fence,
        run,
        request,
        model=agent.model,
        provider=config.providers.get(agent.provider),
        content=config.telemetry.content,
    )
    try:
        return await _run_claimed(
            ledger,
            config,
            fence,
            run.id,
            request,
            trace,
            stop,
            subscribers,
            checkpoint,
            clock,
            pi,
            relay,
            launch,
            DayBudget.of(config.service.budgets, request.actor) if budgeted else None,
        )
    finally:
        trace.span.end()
        if trace:
            telemetry.flush_later()


async def _run_claimed(
    ledger: Ledger,
    config: Config,
    fence: Fence,
    run_id: str,
    request: RunRequest,
    trace: RunTrace,
    stop: StopControl | None,
    subscribers: Sequence[Subscriber],
    checkpoint: CheckpointStep | None,
    clock: Clock | None,
    pi: PiInstall | None,
    relay: RelayHook | None,
    launch: PiLaunch | None,
    budget: DayBudget | None = None,
) -> RunOutcome:
    agent = config.agent(request.agent)
    clock = clock or SystemClock()
    stop = stop or StopControl()
    bus = EventBus(list(subscribers))
    run_dir = runs_dir(config) / run_id
    # Where the run is held, from the start: a harness lost before pi starts is confirmed
    # gone on this host at once, instead of leaving an unconfirmable lease.
    await in_thread(
        ledger.heartbeat,
        fence,
        lease_s=config.custody.lease_s,
        placement=custody_place.placement(pi=None, run_dir=run_dir),
    )
    try:
        keys = provider_keys(config, request.agent)
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
        start_error: OSError | None = None
        if launch is None and config.custody.detached:
            # A worker's run: pi loads while the view is built and the run's files written.
            # Started in a thread: its files and spawn would hold up the event loop, which a
            # service shares between its runs and requests. Shielded, so a cancel lands after
            # it, where the launch is discarded below instead of lost.
            with anyio.CancelScope(shield=True):
                launch, start_error = await in_thread(
                    start_pi, config, request, pi=pi, run_id=run_id, workdir=workdir
                )
        building = telemetry.now_ns()
        try:
            view = await followup_view(ledger, config, request)
        except Refused as exc:
            trace.view_refused(exc.reason.value, building)
            raise
        trace.view(view, building)
    except BaseException as exc:
        trace.failed(exc)
        with anyio.CancelScope(shield=True):
            if launch is not None:
                await in_thread(launch.discard, config.harness.stop_grace_s)
            with contextlib.suppress(LedgerError):
                await in_thread(
                    ledger.end_run,
                    fence,
                    RunStatus.FAILED,
                    extra={"error": f"refused before it started: {exc}", "answer": None},
                )
        raise
    bus.emit(
        RunStarted(run=run_id, session=request.session, agent=request.agent, follow_up=bool(view))
    )
    driver = Driver(
        ClaimedRun(
            ledger=ledger,
            config=config,
            fence=fence,
            request=request,
            run_dir=run_dir,
            workdir=workdir,
            pi=pi,
        ),
        RunControls(
            clock=clock,
            deadline=clock.now() + agent.deadline_s,
            stop=stop,
            bus=bus,
            checkpoint=checkpoint,
            relay=relay,
            trace=trace,
            budget=budget,
        ),
        PiStart(keys=keys, launch=launch, start_error=start_error),
    )
    try:
        outcome = await drive_recorded(
            driver.drive(view),
            ledger=ledger,
            fence=fence,
            bus=bus,
            answer=lambda: driver.state.answer,
        )
    except BaseException as exc:
        trace.failed(exc)
        raise
    trace.ended(outcome)
    return outcome
