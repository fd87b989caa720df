"""``tether model serve|status|stop|config``: the embedded local model on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from tether.cli.exits import Exit, command
from tether.errors import ModelError
from tether.model.localconfig import local_config_text
from tether.model.process import (
    DEFAULT_STATE_DIR,
    LOG_FILE,
    ModelServer,
    ServerStatus,
    StopOutcome,
    clear_state,
    server_status,
    stop_recorded,
    write_state,
)

model_app = typer.Typer(
    rich_markup_mode=None,  # help text is plain: "[followup]" is not markup
    help="The embedded local model (SmolLM2-135M on llama.cpp), served on 127.0.0.1.",
    no_args_is_help=True,
)
console = Console(highlight=False, soft_wrap=True)

StateDirOpt = Annotated[
    Path,
    typer.Option("--state-dir", help="Where the server's pid/port record and log are kept."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _terminate_on_sigterm() -> None:
    # A foreground server is a child in its own process group: turn SIGTERM into an exception so
    # the `finally` that stops it runs.
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@model_app.command("serve")
@command
def serve(
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (0: any free one).")] = 0,
    background: Annotated[
        bool, typer.Option("--background", help="Start it, print its URL and return.")
    ] = False,
    threads: Annotated[
        int | None, typer.Option("--threads", help="CPU threads (default: all cores).")
    ] = None,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    as_json: JsonOpt = False,
) -> None:
    """Serve the embedded model on an OpenAI-compatible endpoint until stopped.

    Example: tether model serve --background && tether model config > tether.toml
    """
    status, state = server_status(state_dir)
    if status in (ServerStatus.RUNNING, ServerStatus.NOT_ANSWERING) and state is not None:
        raise ModelError(
            f"a model server is already running at {state.base_url} (pid {state.pid}); "
            "stop it with `tether model stop`"
        )
    if not as_json:
        console.print("starting the model server (loading the model takes a few seconds) …")
    server = ModelServer.start(log_path=state_dir / LOG_FILE, port=port, threads=threads)
    write_state(server.state, state_dir)
    if as_json:
        print(json.dumps({"status": "running", **_describe(server.state.base_url, server.pid)}))
    else:
        console.print(f"model server [bold]{server.base_url}[/] (pid {server.pid}, model smollm2)")
    if background:
        server.detach()
        if not as_json:
            console.print(
                "stop it with `tether model stop`; write a config with `tether model config`"
            )
        return
    _terminate_on_sigterm()
    try:
        if not as_json:
            console.print("press Ctrl-C to stop")
        code = server.wait()
        console.print(f"[red]the model server exited with status {code}[/]; see {server.state.log}")
        raise typer.Exit(Exit.ERROR)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        clear_state(state_dir)


def _describe(base_url: str, pid: int) -> dict[str, object]:
    return {"base_url": base_url, "pid": pid, "model": "smollm2"}


@model_app.command("status")
@command
def status(state_dir: StateDirOpt = DEFAULT_STATE_DIR, as_json: JsonOpt = False) -> None:
    """Say whether the recorded model server is running and answering (exit 1 when not).

    Example: tether model status --json
    """
    current, state = server_status(state_dir)
    if as_json:
        out: dict[str, object] = {"status": current.value}
        if state is not None:
            out.update(_describe(state.base_url, state.pid), log=state.log)
        print(json.dumps(out))
    elif state is None:
        console.print("no model server is recorded; start one with `tether model serve`")
    else:
        words = {
            ServerStatus.RUNNING: "running",
            ServerStatus.NOT_ANSWERING: "alive but not answering (loading, or wedged)",
            ServerStatus.STALE: "gone (stale record; `tether model stop` clears it)",
        }[current]
        console.print(f"model server {state.base_url} (pid {state.pid}): {words}; log {state.log}")
    if current is not ServerStatus.RUNNING:
        raise typer.Exit(Exit.ERROR)


@model_app.command("stop")
@command
def stop(state_dir: StateDirOpt = DEFAULT_STATE_DIR, as_json: JsonOpt = False) -> None:
    """Stop the recorded model server (SIGTERM, then SIGKILL after a grace period).

    Example: tether model stop
    """
    outcome, state = stop_recorded(state_dir)
    if as_json:
        print(json.dumps({"status": outcome.value, "pid": state.pid if state else None}))
        return
    if outcome is StopOutcome.STOPPED and state is not None:
        console.print(f"stopped the model server (pid {state.pid})")
    elif outcome is StopOutcome.STALE and state is not None:
        console.print(
            f"the recorded model server (pid {state.pid}) was already gone; record cleared"
        )
    else:
        console.print("no model server is recorded")


@model_app.command("config")
@command
def config(
    budget: Annotated[
        int, typer.Option("--budget", help="followup.budget_bytes for the written config.")
    ] = 240_000,
    agent: Annotated[
        str, typer.Option("--agent", help="Name of the agent to define.")
    ] = "assistant",
    ledger: Annotated[
        str, typer.Option("--ledger", help="Ledger URL for the written config.")
    ] = "sqlite:.tether/ledger.db",
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
) -> None:
    """Print a tether.toml whose agent runs on the running model server.

    Example: tether model config --agent helper > tether.toml
    """
    current, state = server_status(state_dir)
    if current is not ServerStatus.RUNNING or state is None:
        raise ModelError(
            "no model server is answering; start one with `tether model serve --background`"
        )
    sys.stdout.write(
        local_config_text(state.base_url, ledger_url=ledger, budget_bytes=budget, agent=agent)
    )
