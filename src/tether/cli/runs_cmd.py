"""``tether runs``: the run directories (pi's agent dir, session file and log of each run)."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from rich.console import Console

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.counts import counted
from tether.cli.exits import command
from tether.errors import ConfigError
from tether.harness.rundir import prune_runs

__all__ = ["parse_age", "runs_app"]

runs_app = typer.Typer(help="Run directories: pi's files of each run.", no_args_is_help=True)
console = Console(highlight=False, soft_wrap=True)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` in seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not match:
        raise ConfigError(
            f"--older-than {text!r}: use a number and a unit (s, m, h, d, w), e.g. 7d"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


@runs_app.command("prune")
@command
def prune(
    older_than: Annotated[
        str, typer.Option("--older-than", help="Age of the directories to remove, e.g. 7d, 12h.")
    ],
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Remove run directories older than an age (runs still queued or running are kept).

    Example: tether runs prune --older-than 7d
    """
    seconds = parse_age(older_than)
    cfg, store = open_configured_ledger(config, ledger)
    with store:
        pruned = prune_runs(cfg, store, older_than_s=seconds)
    removed = counted(len(pruned.removed), "run directory")
    console.print(f"removed {removed} older than {older_than}")
    for path in pruned.kept_live:
        console.print(f"kept {path}: its run is still live")
