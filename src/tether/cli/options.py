"""``--config`` and ``--ledger``: given after the command (``tether sessions --config X``) or
before it (``tether --config X sessions``); after it wins.

Kept apart from :mod:`tether.cli.common` (which opens ledgers) so that the root of the CLI
(:mod:`tether.cli.app`) takes them without importing any command's code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

__all__ = ["ConfigOpt", "LedgerOpt", "RootConfigOpt", "RootLedgerOpt", "check_root_options"]

GLOBAL = ("config", "ledger")
_TAKEN = "tether.options.taken"
"""``ctx.meta`` key (meta is shared by a command's context and its parents'): the names of
:data:`GLOBAL` the running command takes."""

_USES = {"config": "a tether.toml", "ledger": "the configured ledger"}

T = TypeVar("T")

_CONFIG_HELP = "tether.toml to use (default: $TETHER_CONFIG or ./tether.toml)."
_LEDGER_HELP = "Ledger URL, overriding the config (memory:, sqlite:PATH, postgresql://…)."


def _from_root(ctx: typer.Context, param: typer.CallbackParam, value: T | None) -> T | None:
    """The command's own value, else the one given before the command."""
    assert param.name is not None
    ctx.meta.setdefault(_TAKEN, set()).add(param.name)
    if value is not None:
        return value
    root = ctx.find_root()
    return root.params.get(param.name) if root is not ctx else None


ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help=_CONFIG_HELP, callback=_from_root)
]
LedgerOpt = Annotated[str | None, typer.Option("--ledger", help=_LEDGER_HELP, callback=_from_root)]
RootConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help=_CONFIG_HELP + " Also after the command.")
]
RootLedgerOpt = Annotated[
    str | None, typer.Option("--ledger", help=_LEDGER_HELP + " Also after the command.")
]


def check_root_options(command: Any) -> Any:
    """``command`` (every command of a group) refusing, as a usage error (exit 2), a
    ``--config`` or ``--ledger`` given before it when it takes none: ``tether --ledger X setup``
    would otherwise pass silently, and ``tether model config`` has a ``--ledger`` of its own
    (the URL it writes)."""
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            check_root_options(sub)
    else:
        command.invoke = _checked(command.invoke)
    return command


def _checked(invoke: Callable[[typer.Context], Any]) -> Callable[[typer.Context], Any]:
    def checked(ctx: typer.Context) -> Any:
        root = ctx.find_root()
        taken = ctx.meta.get(_TAKEN, set())
        for name in GLOBAL:
            if root is not ctx and root.params.get(name) is not None and name not in taken:
                raise typer.BadParameter(
                    f"`{ctx.command_path}` does not use {_USES[name]}; leave --{name} out "
                    f"(`{ctx.command_path} --help` lists what it takes, after the command)",
                    ctx=ctx,
                    param_hint=f"'--{name}' before the command",
                )
        return invoke(ctx)

    return checked
