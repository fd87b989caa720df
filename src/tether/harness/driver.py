"""The driver: one claimed run, from pi's start to the run's end (docs/cli.md#tether-run steps 5-7).

pi is had one of three ways, behind one transport seam (:class:`tether.pi.transport.
AgentTransport`): as this process's child (``drive`` without custody), under a keeper started
ahead of the run (``drive`` with custody), or by taking over a keeper whose harness was lost
(``resume``). From there the run is the same: the task turn inside its stop scopes, the
checkpoint step after a settled, successful turn, pi closed (orderly, escalating), the last
mirror pass, and the end (:mod:`tether.harness.ending`). The helper tasks (following pi's
events, mirroring, the heartbeat, the deadline, the relay) run beside the turn; a failure in
one stops pi and is reported, never lost.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from tether import telemetry
from tether.errors import FencedOut, LedgerError, RunNotActive, StorageError
from tether.events import PiStarted
from tether.followup import FollowupView
from tether.harness import helpers
from tether.harness.bounds import RunBounds
from tether.harness.context import ClaimedRun, PiStart, Progress, RunControls
from tether.harness.custody.markers import Marked, Markers
from tether.harness.custody.owner import newer_owner
from tether.harness.custody.recovery import await_lost_checkpoint
from tether.harness.custody.state import CustodyState, load_run_state
from tether.harness.ending import PiEnded, RunEnder
from tether.harness.prepare import Prepared, make_mirror, prepare
from tether.harness.pump import RunState, follower
from tether.harness.relay import LivePi
from tether.harness.rundir import make_run_dir
from tether.harness.stops import Stopped, StopReason, race_clock
from tether.harness.storage import StorageRetry
from tether.harness.tools import ToolServer
from tether.harness.turn import (
    NOT_NEEDED,
    CheckpointResult,
    NotTried,
    PiFailed,
    PiSettled,
    RunOutcome,
    SettledTurn,
    TaskEnd,
)
from tether.harness.usage import UsageTally, watch_budget
from tether.ledger import ReceiptReason
from tether.mirror.mirror import Mirror
from tether.pi.client import Record, RpcClient
from tether.pi.continuation import new_nonce
from tether.pi.detached import KeeperTransport
from tether.pi.errors import PiStartupFailed, TransportClosed
from tether.pi.keys import key_channel
from tether.pi.launch import pi_command
from tether.pi.protocol import Command, Disposition
from tether.pi.toolchannel import ToolChannel
from tether.pi.transport import AgentTransport, SubprocessTransport
from tether.threads import in_thread

__all__ = ["Driver"]

Opener = contextlib.AbstractAsyncContextManager[AgentTransport]


@contextlib.asynccontextmanager
async def _not_started(why: str) -> AsyncIterator[AgentTransport]:
    """The transport of a pi that could not be started: entering it fails the task turn."""
    raise PiStartupFailed(why)
    yield  # pragma: no cover  (never reached: it makes this a generator)


class Driver:
    """Drives one claimed run. ``drive`` (or ``resume``) returns the outcome; what pi was seen
    doing is in ``state`` (observations), what the run came to is in the values the phases
    return."""

    def __init__(self, run: ClaimedRun, controls: RunControls, start: PiStart) -> None:
        self.run = run
        self.controls = controls
        self.start = start
        self.state = RunState()
        self.progress = Progress()
        self.storage = StorageRetry(controls.clock, run.config.harness.storage_retry_s)
        self.ender = RunEnder(run, self.storage)
        self.markers = Markers(run.run_dir)
        self.usage = UsageTally()
        """What pi reported the run's provider calls used (the record's ``usage``)."""
        self.bounds = RunBounds(run.request.agent, run.agent, controls.stop)
        """``max_turns``, ``max_tool_calls``, ``max_repeated_tool_calls`` (a soft stop)."""

    # -- three ways to pi ------------------------------------------------------------------------

    async def drive(self, view: FollowupView | None) -> RunOutcome:
        run, launch = self.run, self.start.launch
        if not run.config.custody.detached:
            return await self._drive_child(view)
        # pi was started when the request was admitted (or the run claimed) and loads while
        # the run's rows and its session file are written; then it is let through its gate.
        try:
            tools = launch.tools if launch is not None else ToolChannel.new(run.run_dir)
            nonce = launch.nonce if launch is not None and launch.nonce else new_nonce()
            prepared = await self._prepare(view, tools, nonce)
        except BaseException:
            if launch is not None:
                with anyio.CancelScope(shield=True):
                    await in_thread(launch.discard, run.grace, keep_dir=True)
            raise
        opener: Opener
        if launch is None:
            opener = _not_started(f"cannot start pi's keeper: {self.start.start_error}")
        else:
            launch.release()
            opener = KeeperTransport.adopt(
                run.run_dir,
                launch.keeper,
                stderr_log=launch.stderr_log,
                grace_s=run.grace,
                before_send=self.markers.mark,
            )
        return await self._drive_pi(opener, prepared, self._tools(tools))

    async def _drive_child(self, view: FollowupView | None) -> RunOutcome:
        """pi as this process's child (``custody.detached = false``): it ends with the harness."""
        run = self.run
        tools = ToolChannel.new(make_run_dir(run.config, run.fence.run))
        nonce = new_nonce()
        prepared = await self._prepare(view, tools, nonce)
        # The provider key reaches pi over this channel only (docs/security.md).
        with key_channel(self.start.keys) as keys:
            command = pi_command(
                run.config,
                run.request.agent,
                pi=run.pi,
                run_dir=run.run_dir,
                keys=keys,
                tools=tools,
                workdir=run.workdir,
                extensions=run.request.extensions,
                nonce=nonce,
            )
            opener = SubprocessTransport.open(
                command.argv,
                env=command.env,
                cwd=run.workdir,
                stderr_log=run.run_dir / "pi.log",
                grace_s=run.grace,
                pass_fds=command.pass_fds,
            )
            return await self._drive_pi(opener, prepared, self._tools(tools))

    async def _prepare(self, view: FollowupView | None, tools: ToolChannel, nonce: str) -> Prepared:
        c = self.controls
        return await prepare(
            self.run,
            view,
            tools,
            obligations=self.progress.obligations,
            clock=c.clock,
            deadline=c.deadline,
            bus=c.bus,
            nonce=nonce,
        )

    async def resume(self, placement: dict[str, Any]) -> RunOutcome:
        """Take over a run whose harness was lost, on its original pi
        (docs/architecture.md#custody): attach
        to the keeper, replay pi's events from the start (the mirror writes each entry once,
        by id), wait for pi to settle without prompting again, and finish the run. A
        ``compact`` that may have been delivered is never sent again."""
        run = self.run
        saved: CustodyState = load_run_state(run.run_dir)
        self.progress.resuming = True
        self.progress.obligations.add(saved.sources)
        mirror = make_mirror(
            run,
            offset=saved.offset,
            known=dict(saved.known),
            request_seq=saved.request_seq,
            bus=self.controls.bus,
            obligations=self.progress.obligations,
            nonce=saved.nonce,
            session_file=saved.session_file,
        )
        opener = KeeperTransport.attach(
            run.run_dir, placement, grace_s=run.grace, before_send=self.markers.mark
        )
        # pi knows the tools socket and token it was started with: serve those again.
        tools = None
        if saved.tools_token and saved.tools_path:
            tools = self._tools(ToolChannel.again(Path(saved.tools_path), saved.tools_token))
        return await self._drive_pi(opener, Prepared(mirror, saved.view, saved.offset), tools)

    def _tools(self, channel: ToolChannel) -> ToolServer:
        run = self.run
        return ToolServer(
            ledger=run.ledger,
            grants=run.config.access.grants,
            fence=run.fence,
            agent=run.request.agent,
            actor=run.request.actor,
            obligations=self.progress.obligations,
            channel=channel,
        )

    # -- with pi ---------------------------------------------------------------------------------

    async def _drive_pi(
        self, opener: Opener, prepared: Prepared, tools: ToolServer | None
    ) -> RunOutcome:
        mirror = prepared.mirror
        task: TaskEnd = PiFailed(StopReason.STARTUP_FAILED, "pi was not started")
        checkpoint, late = NOT_NEEDED, None
        exit_status: int | None = None
        diagnostics = ""
        lost: str | None = None
        try:
            async with opener as transport, anyio.create_task_group() as keeper:
                # Lives through pi's orderly close too: a second Ctrl-C there kills at once.
                keeper.start_soon(
                    helpers.kill_on_hard_stop,
                    self.controls.stop,
                    transport,
                    functools.partial(self._handed_over, transport),
                )
                if tools is not None:
                    # recall and note (docs/contracts.md#recall-and-notes)
                    await keeper.start(tools.serve)
                try:
                    task, checkpoint, late = await self._with_pi(transport, mirror)
                finally:
                    diagnostics = transport.diagnostics()
                    with anyio.CancelScope(shield=True):
                        # The end of pi's stdin, and the signals after it, are the owner's:
                        # a pi a newer owner holds is left to it.
                        await self._handed_over(transport)
                        await transport.aclose()
                    keeper.cancel_scope.cancel()
            exit_status, lost = transport.exit_status, transport.lost()
        except (PiStartupFailed, TransportClosed) as exc:
            task = PiFailed(StopReason.STARTUP_FAILED, str(exc))
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self.storage.retried(functools.partial(mirror.sync, final=True))
                except (FencedOut, RunNotActive) as exc:
                    self.progress.failed(Stopped.fenced(exc))
                except StorageError as exc:
                    self.progress.failed(self._storage_failure(exc))
        if self.progress.prompted and not self.state.settled:
            # pi's events stopped before it settled (its keeper died, it was killed): what it
            # authored is in its session file, mirrored just now, so that is the answer.
            self.state.answer = mirror.last_answer or self.state.answer
        agent = self.run.agent
        return await self.ender.conclude(
            PiEnded(task, checkpoint, late, exit_status, diagnostics, lost),
            state=self.state,
            progress=self.progress,
            mirror=mirror,
            log_path=self.run.run_dir / "pi.log",
            view_record=prepared.view_record,
            usage=self.usage.value(model=agent.model, provider=agent.provider),
        )

    async def _with_pi(
        self, transport: AgentTransport, mirror: Mirror
    ) -> tuple[TaskEnd, CheckpointResult, Stopped | None]:
        """The task turn, then (after a successful one) the checkpoint; both as values."""
        run, c = self.run, self.controls
        c.bus.emit(PiStarted(pid=transport.pid, version=run.pi.version))
        async with RpcClient.connect(transport, id_prefix=f"e{run.fence.epoch}.") as client:
            see = follower(
                self.state,
                bus=c.bus,
                stop=c.stop,
                mirror=mirror,
                trace=c.trace.on_record if c.trace else None,
                watch=(self.bounds.see, self.usage.see),
            )
            async with client.listening(self._guarded(see)), anyio.create_task_group() as tg:
                tg.start_soon(self._guard, helpers.keep_mirroring(mirror, self.storage))
                tg.start_soon(self._guard, helpers.heartbeat(run, transport, c.clock, self.storage))
                tg.start_soon(helpers.watch_deadline, c.clock, c.deadline, c.stop)
                tg.start_soon(self._guard, helpers.watch_stop_requests(run, c.stop))
                tg.start_soon(helpers.announce_stop, c.stop, c.bus)
                if c.budget:  # the actor's day budget (the service's runs): usage as it goes
                    tg.start_soon(self._guard, watch_budget(run, self.usage, c.budget, c.stop))
                live = LivePi(client, run.actors, run=run.fence.run, session=run.fence.session)
                relaying = anyio.CancelScope()
                if c.relay is not None:
                    tg.start_soon(helpers.relay, c.relay, live, relaying, run.fence.run)
                task = await self._task_turn(client, transport)
                # Nothing more goes into pi once the turn settled (the checkpoint may follow).
                live.close()
                relaying.cancel()
                checkpoint, late = self._not_tried(task), None
                stepped = False
                if self.progress.resuming and self.markers.sent(Marked.COMPACT):
                    # The lost harness may have delivered the summary command: never again.
                    checkpoint, late = await self._lost_checkpoint(client, transport, mirror)
                elif (
                    isinstance(task, PiSettled)
                    and task.succeeded
                    and c.checkpoint is not None
                    and not c.stop.requested
                ):
                    if not transport.channel_ok():
                        checkpoint = CheckpointResult.skipped(
                            NotTried.PI_UNREACHABLE,
                            f"pi's command FIFO of run {run.fence.run} is missing: no "
                            "checkpoint and no further prompts until it is checked",
                        )
                    else:
                        stepped = True
                        checkpoint, late = await self._checkpoint(client, transport, mirror)
                if not stepped:
                    c.trace.checkpoint(checkpoint, {}, None)  # the step never ran: say why
                if transport.exit_status is not None:
                    # pi is gone (killed, or it died): its last records are read before the
                    # last mirror pass, which mirrors only the entries pi announced.
                    with anyio.move_on_after(1.0):
                        await client.closed.wait()
                tg.cancel_scope.cancel()
        return task, checkpoint, late

    def _not_tried(self, task: TaskEnd) -> CheckpointResult:
        """The checkpoint of a run whose step does not run, and why."""
        c = self.controls
        if not (isinstance(task, PiSettled) and task.succeeded):
            return CheckpointResult.not_needed(NotTried.TURN_NOT_SUCCESSFUL)
        if c.checkpoint is None:
            return CheckpointResult.not_needed(NotTried.NO_STEP)
        if c.stop.requested:
            return CheckpointResult.not_needed(NotTried.STOP_IN_PROGRESS)
        return NOT_NEEDED

    def _storage_failure(self, exc: StorageError) -> Stopped:
        return Stopped(
            StopReason.STORAGE_ERROR,
            True,
            detail=f"the ledger could not be written ({exc}); the run's messages, its answer "
            f"included, are kept in pi's session file {self.run.run_dir / 'session.jsonl'}",
        )

    def _guarded(self, see: Callable[[Record], None]) -> Callable[[Record], None]:
        """``see`` as the client's listener: as :meth:`_guard` for a task, a failure in it
        stops pi and is reported, never lost (nor taken for pi's output failing)."""

        def guarded(item: Record) -> None:
            try:
                see(item)
            except Exception as exc:
                self._failed(exc)

        return guarded

    async def _guard(self, coro: Awaitable[None]) -> None:
        """Run a helper task; a failure in it stops pi and is reported, never lost."""
        try:
            await coro
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, FencedOut | RunNotActive):
            failure = Stopped.fenced(exc)
        else:
            failure = Stopped(StopReason.PROTOCOL_ERROR, True, detail=f"the harness failed: {exc}")
        self.progress.failed(failure)
        self.controls.stop.stop_hard(failure.reason, failure.detail)

    # -- the task turn ---------------------------------------------------------------------------

    async def _task_turn(self, client: RpcClient, transport: AgentTransport) -> TaskEnd:
        """Prompt and wait for pi to settle, inside the stop scopes; a stop is a value."""
        stop = self.controls.stop
        with stop.scope(hard=True):
            with stop.scope(hard=False):
                return await self._prompt_and_settle(client)
            if not stop.hard and self.progress.prompted and self.state.settled:
                # pi settled before the soft stop reached this task (asked between pi's settle
                # and this task's waking): the turn ended as pi ended it, as it does for a stop
                # asked a moment later.
                return self._settled()
            # The soft scope caught a soft stop or the deadline: abort, let pi settle (unless
            # pi is a newer owner's now: then nothing more goes to it).
            if await self._handed_over(transport):
                return self._fenced()
            return await self._abort(client)
        if not await self._handed_over(transport):
            await transport.kill()
        return stop.value()

    async def _handed_over(self, transport: AgentTransport) -> bool:
        """Whether a newer owner holds the run (docs/architecture.md#custody, invariant 16): asked
        before
        anything that stops pi, whatever the stop. If one does, pi is left to it (a keeper's
        pi is disowned; a child pi, which no one can take over, ends with this harness), and
        the run's failure names the owner."""
        run = self.run
        if self.progress.taken_over is None:
            try:
                found = await in_thread(newer_owner, run.ledger, run.fence)
            except LedgerError:
                return False  # not known (the ledger failed): the fence on every write holds
            if found is None:
                return False
            self.progress.handed_over(found, run.fence.epoch)
        await transport.fenced_out()
        return True

    def _fenced(self) -> Stopped:
        assert self.progress.failure is not None
        return self.progress.failure

    def _settled(self) -> TaskEnd:
        state = self.state
        if state.settled:
            return PiSettled(aborted=state.settled_aborted, last=state.last_assistant)
        return PiFailed(
            StopReason.TRANSPORT_LOST, f"pi went away before the run settled: {state.closed_reason}"
        )

    async def _prompt_and_settle(self, client: RpcClient) -> TaskEnd:
        if self.progress.resuming and self.markers.sent(Marked.PROMPT):
            # The lost harness prompted pi: follow the same run to its end.
            self.progress.prompted = True
            await self.state.done.wait()
            return self._settled()
        try:
            images = {"images": list(self.run.request.images)} if self.run.request.images else {}
            response = await client.request(Command.PROMPT, message=self.run.request.text, **images)
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
        self.progress.prompted = True
        await self.state.done.wait()
        return self._settled()

    async def _abort(self, client: RpcClient) -> TaskEnd:
        """Send ``abort`` and wait up to the grace period for pi to settle; if it does not, the
        stop escalates (the hard scope catches it and pi is killed)."""
        stop, clock = self.controls.stop, self.controls.clock
        stopped = stop.value()
        if self.state.closed_reason is not None:
            return stopped

        async def abort_and_settle() -> None:
            with contextlib.suppress(TransportClosed):
                await client.request(Command.ABORT)
            if self.progress.prompted or self.state.turns:
                await self.state.done.wait()

        settled, _ = await race_clock(clock, clock.now() + self.run.grace, abort_and_settle)
        if not settled and self.state.closed_reason is None:
            stop.escalate()
            await anyio.lowlevel.checkpoint()  # the hard scope takes it from here
        return stopped

    # -- the checkpoint --------------------------------------------------------------------------

    async def _checkpoint(
        self, client: RpcClient, transport: AgentTransport, mirror: Mirror
    ) -> tuple[CheckpointResult, Stopped | None]:
        """The checkpoint step after a successful task turn. A soft stop or the deadline sends
        ``abort`` (pi aborts the summary and answers ``compact``); a hard stop cancels the step
        and kills pi. Returns the result and the stop that landed meanwhile, if any."""
        run, c = self.run, self.controls
        assert c.checkpoint is not None
        started = telemetry.now_ns()
        try:
            await self.storage.retried(mirror.sync)
        except StorageError:
            # The turn's rows are not all in the ledger: no checkpoint can cover them. The
            # final pass tries the rows again; the checkpoint is cancelled.
            return CheckpointResult.skipped(NotTried.ROWS_NOT_STORED), None
        turn = SettledTurn(
            client=client,
            ledger=run.ledger,
            fence=run.fence,
            mirror=mirror,
            config=run.config,
            agent_name=run.request.agent,
            agent=run.agent,
            run_id=run.fence.run,
            session=run.fence.session,
            answer=self.state.answer,
            clock=c.clock,
            deadline=c.deadline,
            stop=c.stop,
            bus=c.bus,
        )
        result: CheckpointResult | None = None
        with c.stop.scope(hard=True):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._abort_on_soft_stop, client, transport, turn.abort_answered)
                try:
                    result = await c.checkpoint(turn)
                except TransportClosed as exc:
                    result = CheckpointResult.refused(
                        ReceiptReason.CANCELLED,
                        f"pi went away during the checkpoint: {exc}",
                    )
                except (FencedOut, RunNotActive) as exc:
                    self.progress.failed(Stopped.fenced(exc))
                    result = CheckpointResult.refused(ReceiptReason.CANCELLED)
                except StorageError:
                    # the task turn is done: a ledger that fails now costs the checkpoint only
                    self.storage.failed()
                    result = CheckpointResult.refused(ReceiptReason.CANCELLED)
                tg.cancel_scope.cancel()
        if result is None:  # cut off by a hard stop
            if not await self._handed_over(transport):
                await transport.kill()
            result = turn.attempt or NOT_NEEDED
        c.trace.checkpoint(result, turn.facts, started)
        return result, (c.stop.value() if c.stop.requested else None)

    async def _lost_checkpoint(
        self, client: RpcClient, transport: AgentTransport, mirror: Mirror
    ) -> tuple[CheckpointResult, Stopped | None]:
        """The checkpoint a lost harness sent, on a resumed run: a soft stop or the deadline
        sends ``abort``, and the wait ends at the compaction's answer or the abort's (pi
        answers it once idle), by the deadline plus the stop grace; a hard stop cancels the
        wait and kills pi."""
        run, c = self.run, self.controls
        answered = anyio.Event()
        result: CheckpointResult | None = None
        with c.stop.scope(hard=True):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._abort_on_soft_stop, client, transport, answered)
                result = await await_lost_checkpoint(
                    run.ledger,
                    run.fence,
                    mirror,
                    run.run_dir,
                    c.clock,
                    c.deadline + run.grace,
                    abort_answered=answered,
                    channel_ok=transport.channel_ok(),
                )
                tg.cancel_scope.cancel()
        if result is None:  # cut off by a hard stop
            if not await self._handed_over(transport):
                await transport.kill()
            result = CheckpointResult.refused(ReceiptReason.CANCELLED)
        return result, (c.stop.value() if c.stop.requested else None)

    async def _abort_on_soft_stop(
        self, client: RpcClient, transport: AgentTransport, answered: anyio.Event | None = None
    ) -> None:
        """On a soft stop (or the deadline), ``abort``: pi aborts the summary and answers once
        it is idle, which sets ``answered``."""
        stop = self.controls.stop
        await stop.soft_requested.wait()
        if not stop.hard and not await self._handed_over(transport):
            with contextlib.suppress(TransportClosed):
                await client.request(Command.ABORT)
                if answered is not None:
                    answered.set()
