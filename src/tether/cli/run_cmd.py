"""``tether run``: one task turn of an agent on a session (DESIGN §3.5)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape as esc
from rich.text import Text

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.exits import Exit, command, err_console
from tether.errors import HarnessError, SessionBusy, SessionRefusing
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
from tether.harness.checkpoint import EXTENSION_PATH, continuation_checkpoint
from tether.harness.run import RunOutcome, RunRequest, execute_run
from tether.harness.stops import StopControl, StopReason
from tether.harness.turn import CheckpointStatus
from tether.ledger import Ledger, RunStatus
from tether.pi.errors import PiNotInstalled

__all__ = ["run"]

out_console = Console(highlight=False, soft_wrap=True)


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
        elapsed = time.monotonic() - self.started
        running = ", ".join(self.running.values())
        line = f"⏳ {self.status} · turn {self.turn} · {self.tools} tool calls · {elapsed:.1f}s"
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


def _say_waiting(event: RunEvent) -> None:
    """Always say, on stderr, which run a waiting request waits for (DESIGN §3.7)."""
    if isinstance(event, Waiting):
        behind = f"run {event.behind}" if event.behind else "the runs queued before it"
        err_console.print(f"run {event.run} waits for {behind} on session {event.session}")


async def _run(
    store: Ledger, cfg: Any, req: RunRequest, show: bool, wait: bool = True
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
        if progress is None:
            return await execute_run(
                store,
                cfg,
                req,
                stop=stop,
                subscribers=subscribers,
                checkpoint=continuation_checkpoint,
                wait=wait,
            )
        with progress:
            return await execute_run(
                store,
                cfg,
                req,
                stop=stop,
                subscribers=subscribers,
                checkpoint=continuation_checkpoint,
                wait=wait,
            )

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


@command
def run(
    request: Annotated[str, typer.Argument(help="The request for the agent ('-' reads stdin).")],
    session: Annotated[
        str, typer.Option("--session", "-s", help="Session id (created on first use).")
    ],
    agent: Annotated[str, typer.Option("--agent", "-a", help="Agent name from the config.")],
    actor: Annotated[
        str, typer.Option("--actor", help="Who is asking, e.g. user:ana.")
    ] = "user:local",
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"run","session","status","answer","checkpoint"}.')
    ] = False,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where the agent's tools run (default: here).")
    ] = None,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="Refuse (exit 3, session_busy) instead of waiting."),
    ] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Run one task turn of an agent on a session and print its answer.

    Exit status: 0 finished, 2 usage or configuration error, 3 refused, 4 the run failed or was
    stopped. Ctrl-C stops the run (abort, then wait for pi); a second Ctrl-C kills pi.

    Example: tether run --session s1 --agent reviewer "Review the last commit"
    """
    text = sys.stdin.read() if request == "-" else request
    if not text.strip():
        err_console.print("[bold red]usage error:[/] the request is empty")
        raise typer.Exit(Exit.USAGE)
    cfg, store = open_configured_ledger(config, ledger)
    req = RunRequest(
        session=session,
        agent=agent,
        text=text,
        actor=actor,
        workdir=workdir,
        extensions=(EXTENSION_PATH,),
    )
    show = not as_json and err_console.is_terminal
    try:
        with store:
            outcome = anyio.run(_run, store, cfg, req, show, not no_wait)
    except Refused as exc:
        if as_json:
            out_console.out(
                json.dumps({"status": "refused", "reason": exc.reason.value, "detail": exc.detail})
            )
        err_console.print(f"[bold red]refused ({exc.reason.value}):[/] {esc(exc.detail)}")
        raise typer.Exit(Exit.REFUSED) from None
    except SessionRefusing as exc:
        if as_json:
            out_console.out(
                json.dumps({"status": "refused", "reason": "session_refusing", "detail": str(exc)})
            )
        err_console.print(f"[bold red]refused (session_refusing):[/] {esc(str(exc))}")
        raise typer.Exit(Exit.REFUSED) from None
    except SessionBusy as exc:
        if as_json:
            out_console.out(
                json.dumps({"status": "refused", "reason": exc.reason, "detail": str(exc)})
            )
        err_console.print(f"[bold red]refused ({exc.reason}):[/] {esc(str(exc))}")
        raise typer.Exit(Exit.REFUSED) from None
    except PiNotInstalled as exc:
        err_console.print(f"[bold red]pi is not installed:[/] {esc(str(exc))}")
        raise typer.Exit(Exit.USAGE) from None
    except HarnessError as exc:
        err_console.print(f"[bold red]not run:[/] {esc(str(exc))}")
        raise typer.Exit(Exit.RUN_FAILED) from None
    if as_json:
        out_console.out(json.dumps(outcome.to_json(), ensure_ascii=False))
    elif outcome.answer is not None:
        out_console.out(outcome.answer)
    if outcome.status is not RunStatus.FINISHED:
        err_console.print(
            f"[bold red]run {outcome.run} {outcome.status.value}[/] ({outcome.stop_reason.value})"
            + (f": {esc(outcome.error)}" if outcome.error else "")
            + f"; pi's log: {esc(str(outcome.run_dir / 'pi.log'))}"
        )
        raise typer.Exit(Exit.RUN_FAILED)
    if outcome.checkpoint.status is CheckpointStatus.REFUSED:
        err_console.print(
            f"[yellow]the continuation checkpoint was {esc(outcome.checkpoint.label)}[/]"
        )
        raise typer.Exit(Exit.REFUSED)
