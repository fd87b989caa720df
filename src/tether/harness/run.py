"""One run of an agent on a session: request → pi → mirror → answer (DESIGN §3.5).

    outcome = await execute_run(ledger, config, RunRequest(session="s1", agent="reviewer",
                                                           text="Review the diff"))

The lifecycle:

1. Check the configuration and find pi (nothing is written when either is wrong).
2. Build the follow-up view when the session has history (a refusal writes nothing).
3. Create and claim the run; write the view's copied rows and the request row (fenced).
4. Give the run its own directory: pi agent dir (``models.json``, ``settings.json``), the
   session file written from the view, pi's stderr log.
5. Start pi, send one ``prompt``, follow events until ``agent_settled`` (``agent_end`` is not the
   end: retries, overflow recovery and queued work follow it), mirroring entries as they land.
6. After a settled, successful task turn, the checkpoint step (one awaited call; see
   :class:`SettledTurn`) may run while events are still read and stops still apply.
7. Close pi (orderly, escalating), mirror what is left, end the run with its status, stop
   reason and answer.

Stops: the deadline (``deadline_s`` of the agent, on the injected ``Clock``) and a soft stop send
``abort`` and wait for pi to settle within ``harness.stop_grace_s``; if it does not, pi is
killed (``escalated``) and the session refuses prompts until an operator clears it, because
pi's idle was never confirmed (invariant 15). A hard stop kills pi's process group at once and
cancels the run's work scope. Whatever answer exists is kept in every outcome (invariant 14).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from tether.clock import Clock, SystemClock
from tether.config import AgentConfig, Config
from tether.errors import FencedOut, LedgerError, RunNotActive, SessionRefusing
from tether.followup import FollowupView, Refusal, build_view
from tether.harness.agentdir import write_agent_dir
from tether.harness.client import RpcClient
from tether.harness.errors import PiStartupFailed, TransportClosed
from tether.harness.events import (
    EventBus,
    PiStarted,
    RunEnded,
    RunStarted,
    StopRequested,
    Subscriber,
)
from tether.harness.pi import PiInstall, find_pi, pi_argv
from tether.harness.protocol import Command, Disposition
from tether.harness.pump import RunState, follow
from tether.harness.sessionfile import PreEntry, write_session_file
from tether.harness.stops import StopControl, StopReason, race_clock
from tether.harness.transport import SubprocessTransport
from tether.harness.turn import (
    NOT_NEEDED,
    CheckpointResult,
    CheckpointStatus,
    CheckpointStep,
    RunOutcome,
    RunRequest,
    SettledTurn,
)
from tether.ledger import Fence, Ledger, NewRow, RowKind, RunStatus
from tether.ledger.models import now_iso
from tether.mirror.entries import Actors
from tether.mirror.mirror import Mirror

__all__ = [
    "NOT_NEEDED",
    "CheckpointResult",
    "CheckpointStatus",
    "CheckpointStep",
    "RunOutcome",
    "RunRequest",
    "SettledTurn",
    "execute_run",
    "runs_dir",
]

T = TypeVar("T")


def runs_dir(config: Config) -> Path:
    """Where runs keep their directories (``harness.runs_dir``; relative to the config file)."""
    base = config.path.parent if config.path else Path.cwd()
    chosen = config.harness.runs_dir
    if chosen is None:
        return base / ".tether" / "runs"
    return chosen if chosen.is_absolute() else base / chosen


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


def _pi_env(extra: dict[str, str], pi: PiInstall) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PI_")}
    env.update(extra)
    env["PI_OFFLINE"] = "1"
    loopback = "127.0.0.1,localhost"
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = f"{loopback},{env[key]}" if env.get(key) else loopback
    env["PATH"] = f"{pi.node_bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


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
) -> RunOutcome:
    """Run one task turn. Raises ``ConfigError``, ``PiNotInstalled``, ``SessionRefusing`` or
    ``Refused`` before anything is written; every later failure ends the run (failed or
    interrupted, with its reason) and is reported in the outcome."""
    agent = config.agent(request.agent)
    config.provider(agent.provider)
    pi = pi or find_pi()
    clock = clock or SystemClock()
    stop = stop or StopControl()
    bus = EventBus(list(subscribers))
    deadline = clock.now() + agent.deadline_s

    session = await in_thread(ledger.ensure_session, request.session)
    if session.refusing:
        raise SessionRefusing(
            f"session {session.id!r} refuses new prompts: {session.refusing}; after checking "
            f"it, clear it with `tether session clear {session.id}`"
        )
    view = await _followup_view(ledger, config, request)

    run = await in_thread(ledger.create_run, request.session, request.agent, run_id=request.run_id)
    fence = await in_thread(ledger.claim_run, run.id)
    run_dir = runs_dir(config) / run.id
    bus.emit(
        RunStarted(run=run.id, session=request.session, agent=request.agent, follow_up=bool(view))
    )
    driver = _Driver(
        ledger=ledger,
        config=config,
        request=request,
        agent=agent,
        pi=pi,
        clock=clock,
        stop=stop,
        bus=bus,
        fence=fence,
        run_dir=run_dir,
        deadline=deadline,
        checkpoint=checkpoint,
    )
    try:
        outcome = await driver.drive(view)
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
    def __init__(
        self,
        *,
        ledger: Ledger,
        config: Config,
        request: RunRequest,
        agent: AgentConfig,
        pi: PiInstall,
        clock: Clock,
        stop: StopControl,
        bus: EventBus,
        fence: Fence,
        run_dir: Path,
        deadline: float,
        checkpoint: CheckpointStep | None,
    ) -> None:
        self.ledger = ledger
        self.config = config
        self.request = request
        self.agent = agent
        self.pi = pi
        self.clock = clock
        self.stop = stop
        self.bus = bus
        self.fence = fence
        self.run_dir = run_dir
        self.deadline = deadline
        self.checkpoint_step = checkpoint
        self.state = RunState()
        self.checkpoint = NOT_NEEDED
        self.grace = config.harness.stop_grace_s
        self.exit_status: int | None = None
        self.diagnostics = ""
        self.view_record: dict[str, Any] | None = None

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

    async def _write_view(self, view: FollowupView | None) -> list[PreEntry]:
        """Write the view's copied messages as new rows of this run (original actors and
        sources, ``extra.origin``); reused ones stay where they are. Returns the session file's
        messages, each with the ledger seq it stands for."""
        if view is None:
            return []
        copies = [vm for vm in view.messages if vm.copied]
        origins = [vm.origin for vm in copies if vm.origin is not None]

        def sources() -> dict[int, tuple[str, ...]]:
            found = {}
            for seq in origins:
                row = self.ledger.row(self.fence.session, seq)
                if row is not None:
                    found[seq] = row.sources
            return found

        by_origin = await in_thread(sources) if origins else {}
        written = iter(
            await in_thread(
                self.ledger.append,
                self.fence,
                [
                    NewRow(
                        actor=vm.actor,
                        kind=RowKind.MESSAGE,
                        body=vm.message,
                        sources=by_origin.get(vm.origin, ()) if vm.origin is not None else (),
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
        self.view_record = _view_record(view, len(copies))
        return entries

    async def drive(self, view: FollowupView | None) -> RunOutcome:
        entries = await self._write_view(view)
        request_seq = await self._record_request()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        agent_dir = write_agent_dir(self.run_dir / "agent", self.config, self.request.agent)
        session_file = self.run_dir / "session.jsonl"
        workdir = (self.request.workdir or Path.cwd()).resolve()
        offset, known = write_session_file(
            session_file, session_id=self.fence.run, cwd=workdir, messages=entries
        )
        mirror = Mirror(
            self.ledger,
            self.fence,
            session_file=session_file,
            actors=Actors(user=self.request.actor, agent=self.request.agent),
            start_offset=offset,
            known=known,
            request=(self.request.text, request_seq),
            bus=self.bus,
        )
        argv = pi_argv(
            self.pi,
            session_file=session_file,
            provider=self.agent.provider,
            model=self.agent.model,
            effort=self.agent.effort,
            tools=self.agent.tools,
            system_prompt=self.agent.system_prompt,
            extensions=self.request.extensions,
        )
        log_path = self.run_dir / "pi.log"
        try:
            await self._with_pi(argv, _pi_env(agent_dir.env, self.pi), workdir, log_path, mirror)
        except PiStartupFailed as exc:
            self.state.fail(StopReason.STARTUP_FAILED, str(exc))
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await mirror.sync(final=True)
                except (FencedOut, RunNotActive) as exc:
                    self.state.fatal = self.state.fatal or exc
        return await self._conclude(mirror, log_path)

    # -- pi --------------------------------------------------------------------------------------

    async def _with_pi(
        self, argv: list[str], env: dict[str, str], workdir: Path, log_path: Path, mirror: Mirror
    ) -> None:
        async with SubprocessTransport.open(
            argv, env=env, cwd=workdir, stderr_log=log_path, grace_s=self.grace
        ) as transport:
            self.bus.emit(PiStarted(pid=transport.pid, version=self.pi.version))
            try:
                async with RpcClient.connect(transport) as client:
                    records = client.subscribe()
                    async with anyio.create_task_group() as tg:
                        work = anyio.CancelScope()
                        tg.start_soon(
                            self._guard,
                            follow(
                                records, self.state, bus=self.bus, stop=self.stop, mirror=mirror
                            ),
                        )
                        tg.start_soon(self._guard, mirror.run())
                        tg.start_soon(self._guard, self._watch_deadline())
                        tg.start_soon(self._guard, self._watch_stop(client, transport, work))
                        with work:
                            await self._main(client, mirror)
                        tg.cancel_scope.cancel()
            finally:
                self.diagnostics = transport.diagnostics()
        self.exit_status = transport.exit_status

    async def _guard(self, coro: Awaitable[None]) -> None:
        """Run a helper task; a failure in it stops pi and is reported, never lost."""
        try:
            await coro
        except Exception as exc:
            self.state.fatal = self.state.fatal or exc
            self.stop.stop_hard(
                StopReason.FENCED_OUT
                if isinstance(exc, FencedOut | RunNotActive)
                else StopReason.PROTOCOL_ERROR
            )

    async def _main(self, client: RpcClient, mirror: Mirror) -> None:
        state = self.state
        if self.stop.requested:
            return
        try:
            response = await client.request(Command.PROMPT, message=self.request.text)
        except TransportClosed as exc:
            state.fail(StopReason.STARTUP_FAILED, f"pi stopped before it took the prompt: {exc}")
            return
        if not response.success:
            state.fail(StopReason.STARTUP_FAILED, f"pi rejected the prompt: {response.error}")
            return
        disposition = response.data.get("disposition") if isinstance(response.data, dict) else None
        if disposition != Disposition.STARTED:
            state.fail(
                StopReason.PROTOCOL_ERROR,
                f"pi did not start a run for the prompt (disposition {disposition!r})",
            )
            return
        state.prompted = True
        await state.done.wait()
        if not self._succeeded() or self.checkpoint_step is None or self.stop.requested:
            return
        # A settled, successful task turn: the checkpoint step runs here, stops still apply.
        await mirror.sync()
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
            answer=state.answer,
            clock=self.clock,
            deadline=self.deadline,
            stop=self.stop,
            bus=self.bus,
        )
        state.checkpointing = True
        try:
            self.checkpoint = await self.checkpoint_step(turn)
        except TransportClosed as exc:
            self.checkpoint = CheckpointResult(
                "refused:cancelled", refuse_session=f"pi went away during the checkpoint: {exc}"
            )
        except (FencedOut, RunNotActive) as exc:
            state.fatal = state.fatal or exc
            self.checkpoint = CheckpointResult("refused:cancelled")
        finally:
            if self.checkpoint is NOT_NEEDED and turn.attempt is not None:
                self.checkpoint = turn.attempt

    def _succeeded(self) -> bool:
        state = self.state
        last = state.last_assistant or {}
        return (
            state.settled
            and not state.settled_aborted
            and state.closed_reason is None
            and last.get("stopReason") not in ("error", "aborted")
        )

    async def _watch_deadline(self) -> None:
        await self.clock.sleep_until(self.deadline)
        self.stop.soft(StopReason.DEADLINE)

    async def _watch_stop(
        self, client: RpcClient, transport: SubprocessTransport, work: anyio.CancelScope
    ) -> None:
        await self.stop.soft_requested.wait()
        self.bus.emit(StopRequested(reason=str(self.stop.reason), hard=self.stop.hard))
        if not self.stop.hard and self.state.closed_reason is None:

            async def abort_and_settle() -> None:
                with contextlib.suppress(TransportClosed):
                    await client.request(Command.ABORT)
                if self.state.prompted or self.state.turns:
                    await self.state.done.wait()

            async def until_hard() -> None:
                await self.stop.hard_requested.wait()

            async def settle_or_hard() -> None:
                async with anyio.create_task_group() as tg:

                    async def first(fn: Callable[[], Awaitable[None]]) -> None:
                        await fn()
                        tg.cancel_scope.cancel()

                    tg.start_soon(first, abort_and_settle)
                    tg.start_soon(first, until_hard)

            settled, _ = await race_clock(self.clock, self.clock.now() + self.grace, settle_or_hard)
            if not settled and self.state.closed_reason is None:
                self.state.idle_unconfirmed = True
                self.stop.escalate()
        await self.stop.hard_requested.wait()
        await transport.kill()
        work.cancel()

    # -- the end ---------------------------------------------------------------------------------

    def _verdict(self) -> tuple[RunStatus, StopReason, str | None]:
        state, stop = self.state, self.stop
        if state.fatal is not None and isinstance(state.fatal, FencedOut | RunNotActive):
            return RunStatus.FAILED, StopReason.FENCED_OUT, str(state.fatal)
        if state.fatal is not None:
            return RunStatus.FAILED, StopReason.PROTOCOL_ERROR, f"the harness failed: {state.fatal}"
        if state.failure is not None:
            reason, message = state.failure
            return RunStatus.FAILED, reason, self._with_stderr(message, reason)
        if state.checkpointing and not stop.hard and stop.reason is not None:
            # The task turn had finished; the stop only cut the checkpoint short.
            return RunStatus.FINISHED, stop.reason, None
        if stop.reason in (StopReason.HARD_STOP, StopReason.DEADLINE, StopReason.SOFT_STOP):
            detail = None
            if stop.escalated:
                detail = f"pi did not settle within {self.grace:g}s of abort; it was killed"
            return RunStatus.INTERRUPTED, stop.reason, detail
        if not state.settled:
            reason = StopReason.TRANSPORT_LOST if state.prompted else StopReason.STARTUP_FAILED
            message = f"pi went away before the run settled: {state.closed_reason}"
            return RunStatus.FAILED, reason, self._with_stderr(message, reason)
        last = state.last_assistant or {}
        if last.get("stopReason") == "error":
            return (
                RunStatus.FAILED,
                StopReason.SETTLED,
                f"the provider failed: {last.get('errorMessage')}",
            )
        if state.settled_aborted or last.get("stopReason") == "aborted":
            return RunStatus.INTERRUPTED, StopReason.SETTLED, "pi aborted the run"
        return RunStatus.FINISHED, StopReason.SETTLED, None

    def _with_stderr(self, message: str, reason: StopReason) -> str:
        tail = [line for line in self.diagnostics.splitlines() if line.strip()][-3:]
        if reason in (StopReason.STARTUP_FAILED, StopReason.TRANSPORT_LOST) and tail:
            message += " | pi's stderr: " + " / ".join(tail)
        return message

    async def _conclude(self, mirror: Mirror, log_path: Path) -> RunOutcome:
        state = self.state
        status, reason, error = self._verdict()
        extra: dict[str, Any] = {
            "stop_reason": reason.value,
            "answer": state.answer,
            "error": error,
            "checkpoint": self.checkpoint.status,
            "turns": state.turns,
            "tool_calls": state.tool_calls,
            "retries": state.retries,
            "omitted_attempts": mirror.omitted_attempts,
            "pi": {"version": self.pi.version, "exit_status": self.exit_status},
            "log": str(log_path),
            "ended_by_harness": now_iso(),
        }
        if self.view_record is not None:
            extra["view"] = self.view_record
        if self.stop.escalated:
            extra["escalated"] = True
        if state.strays:
            extra["strays"] = {"count": state.strays, "samples": state.stray_samples}
        if state.extension_errors:
            extra["extension_errors"] = state.extension_errors[:10]
        if mirror.problems:
            extra["mirror_problems"] = mirror.problems[:10]
        if reason is not StopReason.FENCED_OUT:
            with anyio.CancelScope(shield=True):
                await in_thread(self.ledger.end_run, self.fence, status, extra=extra)
                refusing = self.checkpoint.refuse_session
                if state.idle_unconfirmed:
                    refusing = (
                        f"pi's idle was not confirmed when run {self.fence.run} stopped "
                        f"({reason.value})"
                    )
                if refusing:
                    await in_thread(self.ledger.set_refusing, self.fence.session, refusing)
        return RunOutcome(
            run=self.fence.run,
            session=self.fence.session,
            status=status,
            stop_reason=reason,
            answer=state.answer,
            checkpoint=self.checkpoint.status,
            error=error,
            run_dir=self.run_dir,
            follow_up=self.view_record is not None,
        )
