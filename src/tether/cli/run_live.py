"""What ``tether run`` does once pi is starting: the run itself (:func:`execute_run` under
anyio, with Ctrl-C as stops), the progress it shows, and its answer or refusal.

Kept apart from the command (``run_cmd``), which starts pi as soon as the request is admitted
and imports this module while pi loads.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from tether.cli.counts import counted
from tether.cli.exits import Exit, err_console, translate_errors
from tether.cli.exits import escape as esc
from tether.errors import SessionBusy, SessionRefusing
from tether.events import (
    Compacted,
    Compacting,
    Notice,
    Retrying,
    RunEvent,
    RunStarted,
    StopRequested,
    StrayOutput,
    ToolFinished,
    ToolStarted,
    TurnStarted,
    Waiting,
)
from tether.followup import Refused
from tether.harness.checkpoint import continuation_checkpoint
from tether.harness.run import RunOutcome, RunRequest, execute_run
from tether.harness.stops import StopControl, StopReason
from tether.harness.turn import CheckpointResult, CheckpointStatus
from tether.ledger import Ledger, ReceiptReason, RunStatus
from tether.pi.install import PiInstall
from tether.pi.launch import PiLaunch

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from tether.cli.run_start import Started

__all__ = ["execute", "refused", "run_started"]


class Progress:
    """Live progress on a terminal: turns, tool calls, elapsed time. Quiet otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.turn = 0
        self.tools = 0
        self.running: dict[str, str] = {}
        self.status = "starting pi"
        self.live: Live | None = None

    def __enter__(self) -> Progress:
        from rich.live import Live

        # A renderable function, so the elapsed time moves between events too.
        self.live = Live(
            get_renderable=self._render, console=self.console, refresh_per_second=8, transient=True
        )
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def _render(self) -> Text:
        from rich.text import Text

        elapsed = time.monotonic() - self.started
        running = ", ".join(self.running.values())
        calls = counted(self.tools, "tool call")
        line = f"⏳ {self.status} · turn {self.turn} · {calls} · {elapsed:.1f}s"
        if running:
            line += f" · running {running}"
        return Text(line, style="dim")

    def refresh(self) -> None:
        if self.live is not None:
            self.live.refresh()

    def __call__(self, event: RunEvent) -> None:
        if isinstance(event, Waiting):
            self.status = f"waiting for run {event.behind or '(queued ahead)'}"
        elif isinstance(event, RunStarted):
            kind = "follow-up" if event.follow_up else "first run"
            self.console.print(
                f"[dim]run {esc(event.run)} on session {esc(event.session)} ({kind})[/]"
            )
        elif isinstance(event, TurnStarted):
            self.turn = event.turn
            self.status = "working"
        elif isinstance(event, ToolStarted):
            self.tools += 1
            self.running[event.call_id] = event.name
            args = json.dumps(event.args, ensure_ascii=False)
            self.console.print(f"[cyan]→ {esc(event.name)}[/] {esc(args[:100])}")
        elif isinstance(event, ToolFinished):
            self.running.pop(event.call_id, None)
            mark = "[red]✗[/]" if event.is_error else "[green]✓[/]"
            took = f" {event.duration_ms:.0f}ms" if event.duration_ms is not None else ""
            self.console.print(f"  {mark} {esc(event.name)}{took}")
        elif isinstance(event, Retrying):
            self.console.print(
                f"[yellow]retrying ({event.attempt}/{event.max_attempts}):[/] "
                f"{esc(event.error[:120])}"
            )
        elif isinstance(event, Compacting):
            self.status = f"compacting ({event.reason})"
        elif isinstance(event, Compacted):
            self.status = "working"
        elif isinstance(event, Notice):
            self.console.print(f"[magenta]{esc(event.level)}:[/] {esc(event.message[:200])}")
        elif isinstance(event, StrayOutput):
            self.console.print(f"[red]pi wrote a non-protocol line:[/] {esc(event.line[:120])}")
        elif isinstance(event, StopRequested):
            self.status = f"stopping ({event.reason})"
        self.refresh()


def _maybe_terminal() -> bool:
    """Whether stderr may be a terminal to rich: a tty, or rich told so by the environment
    (``TTY_COMPATIBLE=1``, a non-empty ``FORCE_COLOR``).
    Asked first, so that a run whose stderr is a pipe or a file (a bot's, a service's) does not
    load rich (16–22 ms of CPU) only to learn that it shows no progress."""
    try:
        if sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):
        pass
    return os.environ.get("TTY_COMPATIBLE") == "1" or bool(os.environ.get("FORCE_COLOR"))


def _say_waiting(event: RunEvent) -> None:
    """Always say, on stderr, which run a waiting request waits for."""
    if isinstance(event, Waiting):
        behind = f"run {event.behind}" if event.behind else "the runs queued before it"
        err_console.print(f"run {event.run} waits for {behind} on session {event.session}")


async def _run(
    store: Ledger,
    cfg: Any,
    req: RunRequest,
    show: bool,
    pi: PiInstall,
    wait: bool,
    launch: PiLaunch | None,
) -> RunOutcome:
    stop = StopControl()
    subscribers: list[Any] = [_say_waiting]
    progress = Progress(err_console) if show else None
    if progress is not None:
        subscribers.append(progress)

    async def on_signals() -> None:
        # First Ctrl-C (or SIGTERM, or SIGHUP: a closed terminal): abort and wait for pi to
        # settle; a second: kill it.
        watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        with anyio.open_signal_receiver(*watched) as signals:
            async for _ in signals:
                if stop.requested:
                    stop.stop_hard(StopReason.HARD_STOP)
                else:
                    stop.soft(StopReason.SOFT_STOP)
                    if show:
                        err_console.print("[yellow]stopping: Ctrl-C again to kill pi[/]")

    async def execute() -> RunOutcome:
        run = execute_run(
            store,
            cfg,
            req,
            stop=stop,
            subscribers=subscribers,
            checkpoint=continuation_checkpoint,
            pi=pi,
            wait=wait,
            launch=launch,
        )
        if progress is None:
            return await run
        with progress:
            return await run

    result: list[RunOutcome] = []
    failure: list[BaseException] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signals)
        try:
            result.append(await execute())
        except Exception as exc:  # re-raised below, outside the task group (no exception group)
            failure.append(exc)
        tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return result[0]


def refused(reason: str, detail: str, as_json: bool) -> NoReturn:
    """Say the request was refused (``--json``: on stdout too) and exit 3."""
    if as_json:
        _out(json.dumps({"status": "refused", "reason": reason, "detail": detail}))
    err_console.print(f"[bold red]refused ({reason}):[/] {esc(detail)}")
    raise SystemExit(Exit.REFUSED)


def taken_over(outcome: RunOutcome, now: RunStatus | None, as_json: bool) -> NoReturn:
    """Another owner took the run over: it is not this process's to report as failed. Say so,
    with the run's status in the ledger now, and exit 5."""
    status = now.value if now is not None else "unknown"
    if as_json:
        out = {**outcome.to_json(), "status": status, "taken_over": True}
        _out(json.dumps(out, ensure_ascii=False))
    elif outcome.answer is not None:
        _out(outcome.answer)
    err_console.print(
        f"[bold yellow]run {outcome.run} taken over[/]: {esc(outcome.error or '')}; its status "
        f"in the ledger now: {status}"
    )
    raise SystemExit(Exit.TAKEN_OVER)


def _out(text: str) -> None:
    # Plain stdout: the answer and the JSON are data, and rich is not loaded to print them.
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run_started(started: Started) -> None:
    """Run a started request (:mod:`tether.cli.run_start`): print its answer, exit with its
    status. Raises ``SystemExit`` for every status but 0."""
    from tether.cli.run_start import CONTINUATION_EXTENSION

    args = started.args
    with translate_errors():
        execute(
            started.store,
            started.config,
            session=args.session,
            agent=args.agent,
            text=started.text,
            actor=args.actor,
            workdir=args.workdir,
            run_id=started.run_id,
            extensions=(CONTINUATION_EXTENSION,),
            pi=started.pi,
            as_json=args.as_json,
            wait=args.wait,
            launch=started.launch,
        )


def execute(
    store: Ledger,
    cfg: Any,
    *,
    session: str,
    agent: str,
    text: str,
    actor: str,
    workdir: Path | None,
    run_id: str,
    extensions: tuple[Path, ...],
    pi: PiInstall,
    as_json: bool,
    wait: bool,
    launch: PiLaunch | None,
) -> None:
    """Run the admitted request, print its answer (or the outcome as JSON), exit with its
    status. A refusal is printed here (``--json``: on stdout too); other errors
    (a ledger that fails before pi starts, pi that cannot be driven) leave for
    :func:`tether.cli.exits.translate_errors`, which gives them the status every command does."""
    req = RunRequest(
        session=session,
        agent=agent,
        text=text,
        actor=actor,
        workdir=workdir,
        extensions=extensions,
        run_id=run_id,
    )
    show = not as_json and _maybe_terminal() and err_console.is_terminal
    now: RunStatus | None = None
    try:
        with store:
            outcome = anyio.run(_run, store, cfg, req, show, pi, wait, launch)
            if outcome.stop_reason is StopReason.FENCED_OUT:
                found = store.run(outcome.run)
                now = found.status if found is not None else None
    except Refused as exc:
        refused(exc.reason.value, exc.detail, as_json)
    except SessionRefusing as exc:
        refused("session_refusing", str(exc), as_json)
    except SessionBusy as exc:
        refused(exc.reason, str(exc), as_json)
    if outcome.stop_reason is StopReason.FENCED_OUT:
        taken_over(outcome, now, as_json)
    if as_json:
        _out(json.dumps(outcome.to_json(), ensure_ascii=False))
    elif outcome.answer is not None:
        _out(outcome.answer)
    if outcome.status is not RunStatus.FINISHED:
        err_console.print(
            f"[bold red]run {outcome.run} {outcome.status.value}[/] ({outcome.stop_reason.value})"
            + (f": {esc(outcome.error)}" if outcome.error else "")
            + f"; pi's log: {esc(str(outcome.run_dir / 'pi.log'))}"
        )
        raise SystemExit(Exit.RUN_FAILED)
    # The answer was authored: exit 0 whatever became of the checkpoint (a script that
    # retried would ask again what was answered); its fate is a line on stderr, and --json's.
    # (plain: a run whose stderr is a pipe, as a bot's is, never loads rich)
    print(_checkpoint_line(outcome.checkpoint), file=sys.stderr)


def _checkpoint_line(checkpoint: CheckpointResult) -> str:
    if checkpoint.status is CheckpointStatus.REFUSED:
        reason = (checkpoint.reason or ReceiptReason.CANCELLED).value
        return (
            f"checkpoint: refused ({reason}): the answer is kept; the next run reads this "
            "one's rows without a summary of them"
        )
    if checkpoint.status is CheckpointStatus.WRITTEN:
        return "checkpoint: written"
    return "checkpoint: not needed"
