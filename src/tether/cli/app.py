"""The ``tether`` command: a thin layer over the Python API (one module per command group).

A command's module is imported only when that command runs: ``tether --help`` lists the commands
from the table below without importing any of them, and ``tether context`` never loads the
harness. ``tests/test_cli_help.py`` checks that the one-line help here is each command's own.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

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
    "session": ("ledger_cmd", "session_app", "Operate on one session."),
    "ledger": ("ledger_cmd", "ledger_app", "Move sessions in and out of the ledger as JSON Lines."),
    "model": (
        "model_cmd",
        "model_app",
        "The embedded local model (SmolLM2-135M on llama.cpp), served on 127.0.0.1.",
    ),
    "setup": (
        "setup_cmd",
        "setup",
        "Install the pinned pi and its Node 22 with `npm ci` (needs npm on PATH); idempotent.",
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
        return group
    single = typer.Typer(pretty_exceptions_enable=False)
    single.command(name)(obj)
    return typer.main.get_command(single)


class _LazyGroup(TyperGroup):
    """Lists commands from :data:`COMMANDS`; imports one only to run it or show its own help."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if self._listing or ctx.resilient_parsing:
            short = COMMANDS[cmd_name][2]
            return TyperCommand(name=cmd_name, help=short, short_help=short, callback=None)
        if cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands[cmd_name]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="tether",
    cls=_LazyGroup,
    help="Run pi coding agents on long-lived sessions, inside a fixed context budget.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Run pi coding agents on long-lived sessions, inside a fixed context budget."""


def main() -> None:
    app()
