"""The ``tether`` command: a thin layer over the Python API (one module per command group).

A command's module is imported only when that command runs: ``tether --help`` lists the commands
from the table below without importing any of them, and ``tether context`` never loads the
harness. ``tests/test_cli_help.py`` checks that the one-line help here is each command's own.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from tether.cli.options import RootConfigOpt, RootLedgerOpt, check_root_options

__all__ = ["COMMANDS", "app", "main"]

# name -> (module under tether.cli, attribute: a function or a typer.Typer, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run_cmd", "run", "Run one task turn of an agent on a session and print its answer."),
    "context": (
        "context_cmd",
        "context",
        "Show exactly what a new run of AGENT on SESSION would be given; writes nothing.",
    ),
    "log": ("ledger_cmd", "log", "Show a session's timeline: runs and their rows."),
    "sessions": ("ledger_cmd", "sessions", "List the sessions in the ledger."),
    "usage": (
        "usage_cmd",
        "usage",
        "Show what the runs' provider calls used, by actor, agent and model, as pi reported it.",
    ),
    "session": ("ledger_cmd", "session_app", "Operate on one session."),
    "ledger": ("ledger_cmd", "ledger_app", "Move sessions in and out of the ledger as JSON Lines."),
    "runs": ("runs_cmd", "runs_app", "Run directories: pi's files of each run."),
    "model": (
        "model_cmd",
        "model_app",
        "The embedded local model (SmolLM2-135M on llama.cpp), served on 127.0.0.1.",
    ),
    "recall": (
        "recall_cmd",
        "recall",
        "Search a session's retained rows, or read rows FROM..TO, as ACTOR may see them.",
    ),
    "note": ("recall_cmd", "note_app", "Notes an agent keeps for its later runs on a session."),
    "import": ("interop_cmd", "import_app", "Bring sessions of other tools into the ledger."),
    "export": ("interop_cmd", "export_app", "Write ledger sessions in other tools' formats."),
    "recover": (
        "recover_cmd",
        "recover",
        "Reconcile live runs whose lease expired or whose harness is gone.",
    ),
    "serve": (
        "serve_cmd",
        "serve",
        "Serve the HTTP API (OpenAPI at /openapi.json), with N in-process workers.",
    ),
    "worker": (
        "serve_cmd",
        "worker",
        "Claim queued runs (oldest first, one live run per session) and execute them.",
    ),
    "bridge": (
        "bridge_cmd",
        "bridge_app",
        "Connect a chat platform's threads to sessions (a thread is a session).",
    ),
    "fork": (
        "lifecycle_cmd",
        "fork",
        "Begin a new session as SESSION up to the end of a run, by reference (nothing copied).",
    ),
    "erase": (
        "lifecycle_cmd",
        "erase",
        "Erase a session, or a source and everything derived from it, keeping a receipt.",
    ),
    "retention": (
        "lifecycle_cmd",
        "retention_app",
        "Erase sessions idle longer than [retention] idle_days.",
    ),
    "token": (
        "token_cmd",
        "token_app",
        "The service's bearer tokens ([service.tokens]): add, list, revoke.",
    ),
    "setup": (
        "setup_cmd",
        "setup",
        "Install the pinned pi and its Node 22 with `npm ci` (needs npm on PATH); idempotent.",
    ),
    "eval": ("eval_cmd", "eval_app", "Measure what the next run knows."),
    "demo": (
        "demo_cmd",
        "demo",
        "Show tether's main job on the embedded local model, step by step (the local extra).",
    ),
    "doctor": (
        "doctor_cmd",
        "doctor",
        "Check what a run needs and whether it is there; exits 0 only when nothing is missing.",
    ),
}


def load_command(name: str) -> Any:
    """The click command (or group) of ``name``, importing its module."""
    module, attr, _ = COMMANDS[name]
    obj = getattr(importlib.import_module(f"tether.cli.{module}"), attr)
    if isinstance(obj, typer.Typer):
        group = typer.main.get_group(obj)
        group.name = name
        return check_root_options(group)
    # help text is plain: "[followup]" in an option's help is not rich markup
    single = typer.Typer(
        pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None
    )
    single.command(name)(obj)
    return check_root_options(typer.main.get_command(single))


class _LazyCommands(MutableMapping[str, Any]):
    """The group's commands: every name of :data:`COMMANDS`, each imported on first access."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self._loaded[name] = load_command(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(COMMANDS), **self._loaded})

    def __len__(self) -> int:
        return len({**dict.fromkeys(COMMANDS), **self._loaded})


class _LazyGroup(TyperGroup):
    """Lists commands from :data:`COMMANDS`; imports one only to run it or show its own help."""

    _listing = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _LazyCommands()

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names only: nothing imported

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS and (self._listing or ctx.resilient_parsing):
            short = COMMANDS[cmd_name][2]
            return TyperCommand(name=cmd_name, help=short, short_help=short, callback=None)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    rich_markup_mode=None,  # help text is plain: "[followup]" is not markup
    name="tether",
    cls=_LazyGroup,
    help="Run pi coding agents on long-lived sessions, inside a fixed context budget.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def version_text() -> str:
    """``tether X.Y.Z, pi A.B.C (pinned)``: this package's version and the pi it installs."""
    import json
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        mine = version("tether")
    except PackageNotFoundError:  # a source tree run without installing
        mine = "unknown"
    manifest = Path(__file__).resolve().parent.parent / "runtime" / "package.json"
    pinned = json.loads(manifest.read_text())["dependencies"]["@earendil-works/pi-coding-agent"]
    return f"tether {mine}, pi {pinned} (pinned)"


def _show_version(asked: bool) -> None:
    if asked:
        print(version_text())
        raise typer.Exit()


@app.callback()
def _root(
    config: RootConfigOpt = None,
    ledger: RootLedgerOpt = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print tether's version and the pinned pi's, and exit.",
        ),
    ] = False,
) -> None:
    """Run pi coding agents on long-lived sessions, inside a fixed context budget.

    --config and --ledger may come before the command too (tether --config X sessions); given
    both before and after it, the one after applies.
    """


def main() -> None:
    app()
