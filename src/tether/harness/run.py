"""One run of an agent on a session: request → pi → mirror → answer (DESIGN §3.5).

    outcome = await execute_run(ledger, config, RunRequest(session="s1", agent="reviewer",
                                                           text="Review the diff"))

The lifecycle:

1. Check the configuration (the agent, its provider, the provider's key) and find pi: nothing is
   written when any of them is wrong.
2. Build the follow-up view when the session has history (a refusal writes nothing).
3. Create and claim the run; write the view's copied rows and the request row (fenced).
4. Give the run its own directory: pi agent dir (``models.json``, ``settings.json``), the
   session file written from the view, pi's stderr log.
5. The task turn: start pi, send one ``prompt``, follow events until ``agent_settled``
   (``agent_end`` is not the end: retries, overflow recovery and queued work follow it),
   mirroring entries as they land. It ends with a value (:data:`TaskEnd`): pi settled, pi
   failed, or a stop.
6. After a settled, successful task turn, the checkpoint step (one awaited call; see
   :class:`SettledTurn`) may run while events are still read and stops still apply.
7. Close pi (orderly, escalating), mirror what is left, and end the run with the verdict drawn
   from those values (:func:`tether.harness.turn.verdict`).

Stops are scopes (:mod:`tether.harness.stops`): the deadline (``deadline_s`` of the agent, on the
injected ``Clock``) and a soft stop cancel the turn's soft scope, after which ``abort`` is sent
and pi has ``harness.stop_grace_s`` to settle; if it does not, the stop escalates to the hard
scope, pi is killed and the session refuses prompts until an operator clears it, because pi's
idle was never confirmed (invariant 15). A hard stop kills pi's process group at once, also
while pi is being closed. Whatever answer exists is kept in every outcome (invariant 14).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import msgspec

from tether.access import Obligations
from tether.admission import admit_request
from tether.clock import Clock, SystemClock
from tether.config import Config
from tether.errors import (
    FencedOut,
    HarnessError,
    LedgerError,
    RunNotActive,
    SessionBusy,
    SessionRefusing,
    StorageError,
)
from tether.events import (
    EventBus,
    PiStarted,
    RunEnded,
    RunStarted,
    StopRequested,
    Subscriber,
    Waiting,
)
from tether.files import private_file, remove_later
from tether.followup import FollowupView, Refusal, build_view
from tether.harness import placement as custody_place
from tether.harness.pump import RunState, follow
from tether.harness.relay import LivePi, RelayHook
from tether.harness.rundir import check_workdir, make_run_dir, runs_dir
from tether.harness.stops import StopControl, Stopped, StopReason, race_clock
from tether.harness.stranded import keep_stranded_end
from tether.harness.tools import ToolServer
from tether.harness.turn import (
    NOT_NEEDED,
    CheckpointResult,
    CheckpointStatus,
    CheckpointStep,
    PiFailed,
    PiSettled,
    RunOutcome,
    RunRequest,
    SettledTurn,
    TaskEnd,
    verdict,
)
from tether.ids import new_run_id
from tether.ledger import Fence, Ledger, NewRow, ReceiptReason, RowKind, RunStatus
from tether.ledger.models import now_iso
from tether.mirror.entries import Actors
from tether.mirror.mirror import Mirror
from tether.pi.agentdir import provider_keys
from tether.pi.client import RpcClient
from tether.pi.detached import KeeperTransport
from tether.pi.errors import PiStartupFailed, TransportClosed
from tether.pi.install import PiInstall, find_pi
from tether.pi.keys import key_channel
from tether.pi.launch import PiLaunch, pi_command
from tether.pi.protocol import Command, Disposition
from tether.pi.sessionfile import PreEntry, write_session_file
from tether.pi.toolchannel import ToolChannel
from tether.pi.transport import SubprocessTransport
from tether.processes import start_time

__all__ = [
    "NOT_NEEDED",
    "CheckpointResult",
    "CheckpointStatus",
    "CheckpointStep",
    "RunOutcome",
    "RunRequest",
    "SettledTurn",
    "execute_run",
    "in_thread",
    "run_claimed",
    "runs_dir",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

# Between two tries of a ledger write that failed (a full disk, a lost connection).
_STORAGE_PAUSE_S = 0.5


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking ledger call in a worker thread (the ledger API is synchronous)."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def _request_message(text: str) -> dict[str, Any]:
    """The request as pi will store it when it takes the prompt."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "timestamp": int(time.time() * 1000),
    }


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
    the session's live run (DESIGN §3.7: one live run per session, FIFO; expired leases on the
    session are reconciled first), and run when its turn comes (:func:`run_claimed`).

    ``launch``: pi already started for this request (``PiLaunch.start`` with the request's
    ``run_id``, as ``tether run`` does before it imports the harness). Without one, pi is started
    here, once the request is admitted (with custody). Either way it loads, held at its gate,
    while the request is queued and the run's rows and session file are written, and is
    discarded if the run never starts."""
    try:  # a launch given or made here is discarded if the run never starts
        config.agent(request.agent)
        admit_request(request.text, config.followup)  # before any write (DESIGN §3.5)
        provider_keys(config, request.agent)  # a missing key refuses before any write
        workdir = check_workdir(
            request.workdir or config.workdir(request.agent),
            agent=request.agent,
            config=config,
            ledger=ledger,
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
            launch, _ = _start_pi(
                config, request, pi=pi, run_id=str(request.run_id), workdir=workdir
            )
        return await _queue_and_run(
            ledger,
            config,
            request,
            clock=clock,
            stop=stop,
            subscribers=subscribers,
            checkpoint=checkpoint,
            pi=pi,
            wait=wait,
            relay=relay,
            launch=launch,
        )
    finally:
        if launch is not None and not launch.released:
            # The session refusing, busy or its view refused, the wait withdrawn, or a failure
            # before pi was let through: it read and wrote nothing; end it and its directory.
            with anyio.CancelScope(shield=True):
                await in_thread(launch.discard, config.harness.stop_grace_s)


async def _queue_and_run(
    ledger: Ledger,
    config: Config,
    request: RunRequest,
    *,
    clock: Clock | None,
    stop: StopControl | None,
    subscribers: Sequence[Subscriber],
    checkpoint: CheckpointStep | None,
    pi: PiInstall,
    wait: bool,
    relay: RelayHook | None,
    launch: PiLaunch | None,
) -> RunOutcome:
    stop = stop or StopControl()
    bus = EventBus(list(subscribers))

    session = await in_thread(ledger.ensure_session, request.session)
    await _reconcile(ledger, config, request.session)
    if session.refusing:
        raise _refusing(session.id, session.refusing)
    # Admission: a view refused now writes nothing (the view is built again at the run's turn,
    # when it holds every earlier answer).
    await _followup_view(ledger, config, request)
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
    try:
        fence = await _wait_turn(
            ledger, config, run.id, request.session, bus=bus, wait=wait, stop=stop
        )
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(LedgerError):
            await in_thread(ledger.cancel_queued, run.id)  # never started: withdraw it
        raise
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


def _start_pi(
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


@contextlib.asynccontextmanager
async def _not_started(why: str) -> AsyncIterator[Any]:
    """The transport of a pi that could not be started: entering it fails the task turn."""
    raise PiStartupFailed(why)
    yield  # pragma: no cover  (never reached: it makes this a generator)


def _refusing(session: str, why: str) -> SessionRefusing:
    return SessionRefusing(
        f"session {session!r} refuses new prompts: {why}; after checking "
        f"it, clear it with `tether session clear {session}`"
    )


async def _reconcile(ledger: Ledger, config: Config, session: str) -> None:
    """Reconcile the session's expired leases before touching it (DESIGN §3.7)."""
    # custody imports this module (a resumed run is driven by the same driver): import late.
    from tether.harness.custody import reconcile

    await reconcile(ledger, config, session=session)


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
        await _reconcile(ledger, config, session)
        found = await in_thread(ledger.session, session)
        if found is not None and found.refusing:
            raise _refusing(session, found.refusing)


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
) -> RunOutcome:
    """Execute one claimed run exactly as ``tether run`` does: the view, the request row, pi,
    the mirror, the checkpoint, heartbeats, and the run's end. ``request`` defaults to the
    run's queued request (``extra["request"]``), with the continuation extension when a
    checkpoint step is given. A view refused now ends the run ``failed`` and raises."""
    run = await in_thread(ledger.get_run, fence.run)
    if request is None:
        asked = run.extra.get("request") or {}
        extensions: tuple[Path, ...] = ()
        if checkpoint is not None:
            from tether.harness.checkpoint import EXTENSION_PATH  # checkpoint imports this module

            extensions = (EXTENSION_PATH,)
        request = RunRequest(
            session=run.session,
            agent=run.agent,
            text=str(asked.get("text", "")),
            actor=str(asked.get("actor", "user:local")),
            run_id=run.id,
            extensions=extensions,
        )
    agent = config.agent(request.agent)
    clock = clock or SystemClock()
    stop = stop or StopControl()
    bus = EventBus(list(subscribers))
    run_dir = runs_dir(config) / run.id
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
        workdir = check_workdir(
            request.workdir or config.workdir(request.agent),
            agent=request.agent,
            config=config,
            ledger=ledger,
        )
        pi = pi or find_pi()
        start_error: OSError | None = None
        if launch is None and config.custody.detached:
            # A worker's run: pi loads while the view is built and the run's files written.
            launch, start_error = _start_pi(config, request, pi=pi, run_id=run.id, workdir=workdir)
        view = await _followup_view(ledger, config, request)
    except BaseException as exc:
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
        RunStarted(run=run.id, session=request.session, agent=request.agent, follow_up=bool(view))
    )
    driver = _Driver(
        ledger=ledger,
        config=config,
        request=request,
        pi=pi,
        clock=clock,
        stop=stop,
        bus=bus,
        fence=fence,
        run_dir=run_dir,
        deadline=clock.now() + agent.deadline_s,
        checkpoint=checkpoint,
        keys=keys,
        workdir=workdir,
        relay=relay,
        launch=launch,
        start_error=start_error,
    )
    return await _drive_recorded(driver, ledger, fence, bus, driver.drive(view))


async def _drive_recorded(
    driver: _Driver,
    ledger: Ledger,
    fence: Fence,
    bus: EventBus,
    drive: Awaitable[RunOutcome],
) -> RunOutcome:
    try:
        outcome = await drive
    except BaseException as exc:
        # Cancelled from outside, or a bug: record the run's end before letting it through.
        with anyio.CancelScope(shield=True):
            status = (
                RunStatus.INTERRUPTED
                if isinstance(exc, anyio.get_cancelled_exc_class())
                else RunStatus.FAILED
            )
            with contextlib.suppress(LedgerError):
                await in_thread(
                    ledger.end_run,
                    fence,
                    status,
                    extra={"error": f"the harness stopped: {exc!r}", "answer": driver.state.answer},
                )
        raise
    bus.emit(
        RunEnded(
            run=outcome.run,
            status=outcome.status.value,
            stop_reason=outcome.stop_reason.value,
            answer=outcome.answer,
            error=outcome.error,
        )
    )
    return outcome


async def _followup_view(
    ledger: Ledger, config: Config, request: RunRequest
) -> FollowupView | None:
    """The follow-up view when the session has history (None for its first run); a refused
    view raises ``Refused`` before anything is written."""
    if await in_thread(ledger.last_seq, request.session) == 0:
        return None
    view = await in_thread(
        build_view,
        ledger,
        session=request.session,
        agent=request.agent,
        actor=request.actor,
        request=request.text,
        config=config.followup,
        grants=config.access.grants,
    )
    if isinstance(view, Refusal):
        raise view.error()
    return view


def _view_record(view: FollowupView, copied: int) -> dict[str, Any]:
    """What the run's record keeps about the view it started from."""
    return {
        "budget": view.budget,
        "bytes": view.bytes,
        "messages": len(view.messages),
        "copied": copied,
        "checkpoint": view.checkpoint.seq if view.checkpoint else None,
        "previous_request": view.previous_request.to_json() if view.previous_request else None,
        "gaps": [g.to_json() for g in view.gaps],
    }


class _Driver:
    """Drives one claimed run. ``drive`` returns the outcome; what pi was seen doing is in
    ``state`` (observations), what the run came to is in the values the phases return."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        config: Config,
        request: RunRequest,
        pi: PiInstall,
        clock: Clock,
        stop: StopControl,
        bus: EventBus,
        fence: Fence,
        run_dir: Path,
        deadline: float,
        checkpoint: CheckpointStep | None,
        keys: dict[str, str],
        workdir: Path,
        relay: RelayHook | None = None,
        launch: PiLaunch | None = None,
        start_error: OSError | None = None,
    ) -> None:
        self.ledger = ledger
        self.config = config
        self.request = request
        self.agent = config.agent(request.agent)
        self.pi = pi
        self.clock = clock
        self.stop = stop
        self.bus = bus
        self.fence = fence
        self.run_dir = run_dir
        self.deadline = deadline
        self.checkpoint_step = checkpoint
        self.keys = keys
        self.workdir = workdir
        self.relay = relay
        self.launch = launch
        """pi started for this run ahead of it, held at its gate (custody only)."""
        self.start_error = start_error
        """Why ``launch`` is missing, with custody: pi's keeper could not be started."""
        self.actors = Actors(user=request.actor, agent=request.agent)
        self.grace = config.harness.stop_grace_s
        self.state = RunState()
        self.prompted = False
        self.obligations = Obligations()
        """The sources of everything the run was given; every row it writes carries them."""
        self.failure: Stopped | None = None
        """The harness's own failure (a helper task, the final mirror pass): it wins."""
        self.resuming = False
        """Taking over a run whose harness was lost (pi was prompted by the lost harness)."""
        self.end_recorded = False
        self.end_tried = False
        self.storage_retry_s = config.harness.storage_retry_s
        self.storage_retries = 0
        """Ledger writes that failed and were tried again (a full disk, a lost connection)."""

    # -- setup -----------------------------------------------------------------------------------

    async def _record_request(self) -> int:
        rows = await in_thread(
            self.ledger.append,
            self.fence,
            [
                NewRow(
                    actor=self.request.actor,
                    kind=RowKind.MESSAGE,
                    body=_request_message(self.request.text),
                )
            ],
            request=True,
        )
        return rows[0].seq

    async def _write_view(self, view: FollowupView) -> list[PreEntry]:
        """Write the view's copied messages as new rows of this run (original actors, the
        sources the view carries, ``extra.origin``); reused ones stay where they are. Returns
        the session file's messages, each with the ledger seq it stands for."""
        copies = [vm for vm in view.messages if vm.copied]
        written = iter(
            await in_thread(
                self.ledger.append,
                self.fence,
                [
                    NewRow(
                        actor=vm.actor,
                        kind=RowKind.MESSAGE,
                        body=vm.message,
                        sources=vm.sources,
                        extra={"origin": vm.origin},
                    )
                    for vm in copies
                ],
            )
        )
        entries = []
        for vm in view.messages:
            seq = next(written).seq if vm.copied else (None if vm.synthetic else vm.origin)
            entries.append(PreEntry(message=vm.message, seq=seq))
        return entries

    async def drive(self, view: FollowupView | None) -> RunOutcome:
        if not self.config.custody.detached:
            return await self._drive_child(view)
        # pi was started when the request was admitted (or the run claimed) and loads while
        # the run's rows and its session file are written; then it is let through its gate.
        launch = self.launch
        try:
            tools = launch.tools if launch is not None else ToolChannel.new(self.run_dir)
            mirror, view_record = await self._prepare(view, tools)
        except BaseException:
            if launch is not None:
                with anyio.CancelScope(shield=True):
                    await in_thread(launch.discard, self.grace, keep_dir=True)
            raise
        if launch is None:
            opener = _not_started(f"cannot start pi's keeper: {self.start_error}")
        else:
            launch.release()
            opener = KeeperTransport.adopt(
                self.run_dir, launch.keeper, stderr_log=launch.stderr_log, grace_s=self.grace
            )
        return await self._drive_pi(
            opener, mirror, self.run_dir / "pi.log", view_record, self._tools(tools)
        )

    async def _drive_child(self, view: FollowupView | None) -> RunOutcome:
        """pi as this process's child (``custody.detached = false``): it ends with the harness."""
        tools = ToolChannel.new(make_run_dir(self.config, self.fence.run))
        mirror, view_record = await self._prepare(view, tools)
        log_path = self.run_dir / "pi.log"
        # The provider key reaches pi over this channel only (DESIGN §3.10).
        with key_channel(self.keys) as keys:
            command = pi_command(
                self.config,
                self.request.agent,
                pi=self.pi,
                run_dir=self.run_dir,
                keys=keys,
                tools=tools,
                workdir=self.workdir,
                extensions=self.request.extensions,
            )
            opener = SubprocessTransport.open(
                command.argv,
                env=command.env,
                cwd=self.workdir,
                stderr_log=log_path,
                grace_s=self.grace,
                pass_fds=command.pass_fds,
            )
            return await self._drive_pi(opener, mirror, log_path, view_record, self._tools(tools))

    async def _prepare(
        self, view: FollowupView | None, tools: ToolChannel
    ) -> tuple[Mirror, dict[str, Any] | None]:
        """The run's rows (the view's copies, the request) and pi's session file, and what a
        harness taking the run over needs (DESIGN §3.7)."""
        entries = await self._write_view(view) if view is not None else []
        if view is not None:
            self.obligations.add(view.sources)
        view_record = _view_record(view, sum(vm.copied for vm in view.messages)) if view else None
        request_seq = await self._record_request()
        make_run_dir(self.config, self.fence.run)
        session_file = private_file(self.run_dir / "session.jsonl")
        offset, known = write_session_file(
            session_file, session_id=self.fence.run, cwd=self.workdir, messages=entries
        )
        custody_place.save_run_state(
            self.run_dir,
            {
                "offset": offset,
                "known": known,
                "request_seq": request_seq,
                "deadline_at": time.time() + max(0.0, self.deadline - self.clock.now()),
                "view": view_record,
                "sources": sorted(self.obligations.sources),
                "tools_token": tools.token,
                "tools_path": str(tools.path),
            },
        )
        return self._mirror(session_file, offset, known, request_seq), view_record

    def _mirror(
        self, session_file: Path, offset: int, known: dict[str, int | None], request_seq: int
    ) -> Mirror:
        return Mirror(
            self.ledger,
            self.fence,
            session_file=session_file,
            actors=self.actors,
            start_offset=offset,
            known=known,
            request=(self.request.text, request_seq),
            bus=self.bus,
            obligations=self.obligations,
        )

    async def resume(self, placement: dict[str, Any]) -> RunOutcome:
        """Take over a run whose harness was lost, on its original pi (DESIGN §3.7): attach
        to the keeper, replay pi's events from the start (the mirror writes each entry once,
        by id), wait for pi to settle without prompting again, and finish the run. A
        ``compact`` that may have been delivered is never sent again."""
        saved = custody_place.load_run_state(self.run_dir)
        self.resuming = True
        self.obligations.add(saved.get("sources") or [])
        known = {str(k): v for k, v in (saved.get("known") or {}).items()}
        mirror = self._mirror(
            self.run_dir / "session.jsonl",
            int(saved.get("offset", 0)),
            known,
            int(saved["request_seq"]),
        )
        opener = KeeperTransport.attach(self.run_dir, placement, grace_s=self.grace)
        # pi knows the tools socket and token it was started with: serve those again.
        tools = None
        if saved.get("tools_token") and saved.get("tools_path"):
            channel = ToolChannel.again(Path(saved["tools_path"]), str(saved["tools_token"]))
            tools = self._tools(channel)
        return await self._drive_pi(
            opener, mirror, self.run_dir / "pi.log", saved.get("view"), tools
        )

    def _tools(self, channel: ToolChannel) -> ToolServer:
        return ToolServer(
            ledger=self.ledger,
            grants=self.config.access.grants,
            fence=self.fence,
            agent=self.request.agent,
            actor=self.request.actor,
            obligations=self.obligations,
            channel=channel,
        )

    async def _drive_pi(
        self,
        opener: contextlib.AbstractAsyncContextManager[Any],
        mirror: Mirror,
        log_path: Path,
        view_record: dict[str, Any] | None,
        tools: ToolServer | None,
    ) -> RunOutcome:
        task: TaskEnd = PiFailed(StopReason.STARTUP_FAILED, "pi was not started")
        checkpoint, late = NOT_NEEDED, None
        exit_status: int | None = None
        diagnostics = ""
        try:
            async with opener as transport, anyio.create_task_group() as keeper:
                # Lives through pi's orderly close too: a second Ctrl-C there kills at once.
                keeper.start_soon(self._kill_on_hard_stop, transport)
                if tools is not None:
                    await keeper.start(tools.serve)  # recall and note (DESIGN §3.9)
                try:
                    task, checkpoint, late = await self._with_pi(transport, mirror)
                finally:
                    diagnostics = transport.diagnostics()
                    await transport.aclose()
                    keeper.cancel_scope.cancel()
            exit_status = transport.exit_status
        except (PiStartupFailed, TransportClosed) as exc:
            task = PiFailed(StopReason.STARTUP_FAILED, str(exc))
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self._storage_retried(functools.partial(mirror.sync, final=True))
                except (FencedOut, RunNotActive) as exc:
                    self.failure = self.failure or Stopped.fenced(exc)
                except StorageError as exc:
                    session_file = self.run_dir / "session.jsonl"
                    self.failure = self.failure or self._storage_failure(exc, session_file)
        return await self._conclude(
            mirror,
            log_path,
            task=task,
            checkpoint=checkpoint,
            late=late,
            exit_status=exit_status,
            diagnostics=diagnostics,
            view_record=view_record,
        )

    # -- pi --------------------------------------------------------------------------------------

    async def _kill_on_hard_stop(self, transport: Any) -> None:
        await self.stop.hard_requested.wait()
        if self.stop.reason is StopReason.FENCED_OUT and isinstance(transport, KeeperTransport):
            # A newer owner holds the run and its pi: never signal what it now owns.
            transport.disown()
            return
        await transport.kill()

    async def _heartbeat(self, transport: Any) -> None:
        """Keep the lease and record where pi runs (DESIGN §3.7); a lost lease fences the run
        out (the helper's failure stops it, without touching pi)."""
        pi_place: dict[str, Any]
        if isinstance(transport, KeeperTransport):
            pi_place = dict(transport.placement)
        else:
            pi_place = {
                "pi_pid": transport.pid,
                "pi_start": start_time(transport.pid),
            }
        where = custody_place.placement(pi=pi_place, run_dir=self.run_dir)
        lease_s = self.config.custody.lease_s
        while True:
            try:
                await in_thread(self.ledger.heartbeat, self.fence, lease_s=lease_s, placement=where)
            except StorageError:
                # A ledger that cannot be written does not stop pi (the mirror rides it out):
                # the lease lasts lease_s, and the next beat, a third of it later, tries again.
                self.storage_retries += 1
            await anyio.sleep(lease_s / 3)

    async def _with_pi(
        self, transport: Any, mirror: Mirror
    ) -> tuple[TaskEnd, CheckpointResult, Stopped | None]:
        """The task turn, then (after a successful one) the checkpoint; both as values."""
        self.bus.emit(PiStarted(pid=transport.pid, version=self.pi.version))
        async with RpcClient.connect(transport, id_prefix=f"e{self.fence.epoch}.") as client:
            records = client.subscribe()
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    self._guard,
                    follow(records, self.state, bus=self.bus, stop=self.stop, mirror=mirror),
                )
                tg.start_soon(self._guard, self._keep_mirroring(mirror))
                tg.start_soon(self._guard, self._heartbeat(transport))
                tg.start_soon(self._watch_deadline)
                tg.start_soon(self._announce_stop)
                live = LivePi(client, self.actors, run=self.fence.run, session=self.fence.session)
                relaying = anyio.CancelScope()
                if self.relay is not None:
                    tg.start_soon(self._relay, self.relay, live, relaying)
                task = await self._task_turn(client, transport)
                # Nothing more goes into pi once the turn settled (the checkpoint may follow).
                live.close()
                relaying.cancel()
                checkpoint, late = NOT_NEEDED, None
                compact_sent = self.resuming and (self.run_dir / "compact.sent").exists()
                if compact_sent:
                    # The lost harness may have delivered the summary command: never again.
                    checkpoint = await custody_place.await_lost_checkpoint(
                        self.ledger, self.fence, mirror, self.run_dir, self.clock, self.deadline
                    )
                elif (
                    isinstance(task, PiSettled)
                    and task.succeeded
                    and self.checkpoint_step is not None
                    and not self.stop.requested
                ):
                    if isinstance(transport, KeeperTransport) and not transport.channel_ok():
                        checkpoint = CheckpointResult.refused(
                            ReceiptReason.CANCELLED,
                            f"pi's command FIFO of run {self.fence.run} is missing: no "
                            "checkpoint and no further prompts until it is checked",
                        )
                    else:
                        checkpoint, late = await self._checkpoint(client, transport, mirror)
                tg.cancel_scope.cancel()
        return task, checkpoint, late

    async def _keep_mirroring(self, mirror: Mirror) -> None:
        """Mirror as pi writes. A ledger that cannot be written does not stop pi: the entries
        stay in pi's session file, and the next pass (or the final one) writes them."""
        while True:
            try:
                await mirror.run()
            except StorageError:
                self.storage_retries += 1
                await anyio.sleep(_STORAGE_PAUSE_S)

    async def _storage_retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` again while the ledger cannot be written, up to ``storage_retry_s``."""
        deadline = time.monotonic() + self.storage_retry_s
        while True:
            try:
                return await call()
            except StorageError:
                if time.monotonic() + _STORAGE_PAUSE_S > deadline:
                    raise
                self.storage_retries += 1
                await anyio.sleep(_STORAGE_PAUSE_S)

    def _storage_failure(self, exc: StorageError, session_file: Path) -> Stopped:
        return Stopped(
            StopReason.STORAGE_ERROR,
            True,
            detail=f"the ledger could not be written ({exc}); the run's messages, its answer "
            f"included, are kept in pi's session file {session_file}",
        )

    async def _relay(self, hook: RelayHook, live: LivePi, scope: anyio.CancelScope) -> None:
        """The relay hook, while the turn is live; its failure loses a delivery, not the run."""
        with scope:
            try:
                await hook(live)
            except Exception:
                log.exception("the relay of run %s failed; the run goes on", self.fence.run)

    async def _guard(self, coro: Awaitable[None]) -> None:
        """Run a helper task; a failure in it stops pi and is reported, never lost."""
        try:
            await coro
        except Exception as exc:
            if isinstance(exc, FencedOut | RunNotActive):
                failure = Stopped.fenced(exc)
            else:
                failure = Stopped(
                    StopReason.PROTOCOL_ERROR, True, detail=f"the harness failed: {exc}"
                )
            self.failure = self.failure or failure
            self.stop.stop_hard(failure.reason, failure.detail)

    async def _task_turn(self, client: RpcClient, transport: Any) -> TaskEnd:
        """Prompt and wait for pi to settle, inside the stop scopes; a stop is a value."""
        with self.stop.scope(hard=True):
            with self.stop.scope(hard=False):
                return await self._prompt_and_settle(client)
            # The soft scope caught a soft stop or the deadline: abort, let pi settle.
            return await self._abort(client)
        await transport.kill()
        return self.stop.value()

    async def _prompt_and_settle(self, client: RpcClient) -> TaskEnd:
        state = self.state
        if self.resuming and (self.run_dir / "prompt.sent").exists():
            # The lost harness prompted pi: follow the same run to its end.
            self.prompted = True
            await state.done.wait()
            if state.settled:
                return PiSettled(aborted=state.settled_aborted, last=state.last_assistant)
            return PiFailed(
                StopReason.TRANSPORT_LOST,
                f"pi went away before the run settled: {state.closed_reason}",
            )
        try:
            response = await client.request(Command.PROMPT, message=self.request.text)
        except TransportClosed as exc:
            return PiFailed(
                StopReason.STARTUP_FAILED, f"pi stopped before it took the prompt: {exc}"
            )
        if not response.success:
            return PiFailed(StopReason.STARTUP_FAILED, f"pi rejected the prompt: {response.error}")
        disposition = response.data.get("disposition") if isinstance(response.data, dict) else None
        if disposition != Disposition.STARTED:
            return PiFailed(
                StopReason.PROTOCOL_ERROR,
                f"pi did not start a run for the prompt (disposition {disposition!r})",
            )
        self.prompted = True
        await state.done.wait()
        if state.settled:
            return PiSettled(aborted=state.settled_aborted, last=state.last_assistant)
        return PiFailed(
            StopReason.TRANSPORT_LOST, f"pi went away before the run settled: {state.closed_reason}"
        )

    async def _abort(self, client: RpcClient) -> TaskEnd:
        """Send ``abort`` and wait up to the grace period for pi to settle; if it does not, the
        stop escalates (the hard scope catches it and pi is killed)."""
        stopped = self.stop.value()
        if self.state.closed_reason is not None:
            return stopped

        async def abort_and_settle() -> None:
            with contextlib.suppress(TransportClosed):
                await client.request(Command.ABORT)
            if self.prompted or self.state.turns:
                await self.state.done.wait()

        settled, _ = await race_clock(self.clock, self.clock.now() + self.grace, abort_and_settle)
        if not settled and self.state.closed_reason is None:
            self.stop.escalate()
            await anyio.lowlevel.checkpoint()  # the hard scope takes it from here
        return stopped

    async def _checkpoint(
        self, client: RpcClient, transport: Any, mirror: Mirror
    ) -> tuple[CheckpointResult, Stopped | None]:
        """The checkpoint step after a successful task turn. A soft stop or the deadline sends
        ``abort`` (pi aborts the summary and answers ``compact``); a hard stop cancels the step
        and kills pi. Returns the result and the stop that landed meanwhile, if any."""
        assert self.checkpoint_step is not None
        try:
            await self._storage_retried(mirror.sync)
        except StorageError:
            # The turn's rows are not all in the ledger: no checkpoint can cover them. The
            # final pass tries the rows again; the checkpoint is cancelled.
            return CheckpointResult.refused(ReceiptReason.CANCELLED), None
        turn = SettledTurn(
            client=client,
            ledger=self.ledger,
            fence=self.fence,
            mirror=mirror,
            config=self.config,
            agent_name=self.request.agent,
            agent=self.agent,
            run_id=self.fence.run,
            session=self.fence.session,
            answer=self.state.answer,
            clock=self.clock,
            deadline=self.deadline,
            stop=self.stop,
            bus=self.bus,
        )
        result: CheckpointResult | None = None
        with self.stop.scope(hard=True):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._abort_on_soft_stop, client)
                try:
                    result = await self.checkpoint_step(turn)
                except TransportClosed as exc:
                    result = CheckpointResult.refused(
                        ReceiptReason.CANCELLED,
                        f"pi went away during the checkpoint: {exc}",
                    )
                except (FencedOut, RunNotActive) as exc:
                    self.failure = self.failure or Stopped.fenced(exc)
                    result = CheckpointResult.refused(ReceiptReason.CANCELLED)
                except StorageError:
                    # the task turn is done: a ledger that fails now costs the checkpoint only
                    self.storage_retries += 1
                    result = CheckpointResult.refused(ReceiptReason.CANCELLED)
                tg.cancel_scope.cancel()
        if result is None:  # cut off by a hard stop
            await transport.kill()
            result = turn.attempt or NOT_NEEDED
        return result, (self.stop.value() if self.stop.requested else None)

    async def _abort_on_soft_stop(self, client: RpcClient) -> None:
        await self.stop.soft_requested.wait()
        if not self.stop.hard:
            with contextlib.suppress(TransportClosed):
                await client.request(Command.ABORT)

    async def _watch_deadline(self) -> None:
        await self.clock.sleep_until(self.deadline)
        self.stop.soft(StopReason.DEADLINE)

    async def _announce_stop(self) -> None:
        await self.stop.soft_requested.wait()
        self.bus.emit(StopRequested(reason=str(self.stop.reason), hard=self.stop.hard))

    # -- the end ---------------------------------------------------------------------------------

    async def _record_end(
        self, status: RunStatus, extra: dict[str, Any], refusing: str | None
    ) -> None:
        # Retried as a whole while the ledger fails: an end already written is not written
        # again (that would raise RunNotActive and lose the refusal after it).
        if not self.end_recorded:
            try:
                await in_thread(self.ledger.end_run, self.fence, status, extra=extra)
            except RunNotActive:
                # A try before this one failed as its commit's acknowledgement was lost.
                if not self.end_tried:
                    raise
            finally:
                self.end_tried = True
            self.end_recorded = True
        if refusing:
            await in_thread(self.ledger.set_refusing, self.fence.session, refusing)

    def _with_stderr(self, message: str | None, reason: StopReason, diagnostics: str) -> str | None:
        tail = [line for line in diagnostics.splitlines() if line.strip()][-3:]
        if message and reason in (StopReason.STARTUP_FAILED, StopReason.TRANSPORT_LOST) and tail:
            message += " | pi's stderr: " + " / ".join(tail)
        return message

    async def _conclude(
        self,
        mirror: Mirror,
        log_path: Path,
        *,
        task: TaskEnd,
        checkpoint: CheckpointResult,
        late: Stopped | None,
        exit_status: int | None,
        diagnostics: str,
        view_record: dict[str, Any] | None,
    ) -> RunOutcome:
        state = self.state
        found = verdict(task, late=late, failure=self.failure, grace_s=self.grace)
        error = self._with_stderr(found.error, found.stop_reason, diagnostics)
        escalated = isinstance(task, Stopped) and task.escalated
        # A run that ended well leaves nothing behind; any other keeps its directory to look at.
        keep = (
            found.status is not RunStatus.FINISHED or escalated or bool(checkpoint.refuse_session)
        )
        if keep and error:
            error += f" (pi's log and session file are kept in {self.run_dir})"
        extra: dict[str, Any] = {
            "stop_reason": found.stop_reason.value,
            "answer": state.answer,
            "error": error,
            "checkpoint": checkpoint.label,
            "turns": state.turns,
            "tool_calls": state.tool_calls,
            "retries": state.retries,
            "omitted_attempts": mirror.omitted_attempts,
            "pi": {"version": self.pi.version, "exit_status": exit_status},
            "log": str(log_path),
            "ended_by_harness": now_iso(),
        }
        if view_record is not None:
            extra["view"] = view_record
        if escalated:
            extra["escalated"] = True
        if state.strays:
            extra["strays"] = {"count": state.strays, "samples": state.stray_samples}
        if state.extension_errors:
            extra["extension_errors"] = state.extension_errors[:10]
        if mirror.problems:
            extra["mirror_problems"] = mirror.problems[:10]
        if self.storage_retries:
            extra["storage_retries"] = self.storage_retries
        if found.stop_reason is not StopReason.FENCED_OUT:
            refusing = checkpoint.refuse_session
            if escalated:
                refusing = (
                    f"pi's idle was not confirmed when run {self.fence.run} stopped "
                    f"({found.stop_reason.value})"
                )
            with anyio.CancelScope(shield=True):
                try:
                    await self._storage_retried(
                        functools.partial(self._record_end, found.status, extra, refusing)
                    )
                except StorageError as exc:
                    # No run is left running: the end waits in the runs directory, and the
                    # next run on this ledger records it.
                    where = keep_stranded_end(
                        runs_dir(self.config), self.fence, found.status, extra, refusing
                    )
                    error = (
                        f"{error or f'the ledger could not be written ({exc})'}; the run's end "
                        f"could not be recorded either: it is kept in {where}, and the next run "
                        "records it"
                    )
        if not keep:
            remove_later(self.run_dir)
        return RunOutcome(
            run=self.fence.run,
            session=self.fence.session,
            status=found.status,
            stop_reason=found.stop_reason,
            answer=state.answer,
            checkpoint=checkpoint,
            error=error,
            run_dir=self.run_dir,
            follow_up=view_record is not None,
        )
