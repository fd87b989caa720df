"""``tether usage``: what the runs' provider calls used, summed by actor, agent and model from the
ledger (tether.ledger.usage), the task turns' and the checkpoints' apart."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.exits import command
from tether.errors import UsageError
from tether.ids import check_id
from tether.ledger.usage import GROUPS, UsageLine
from tether.usage import Usage, day_start, figure

__all__ = ["parse_since", "usage"]

console = Console(highlight=False, soft_wrap=True)

_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float) -> float:
    """``today`` (the UTC day so far, a budget's day), an age (``12h``, ``7d``: that long
    ago), or an ISO 8601 date or time (UTC unless it names its offset), in seconds since the
    epoch."""
    text = text.strip()
    if text == "today":
        return day_start(now)
    age = re.fullmatch(r"(\d+(?:\.\d+)?)([mhdw])", text)
    if age:
        return now - float(age.group(1)) * _UNITS[age.group(2)]
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--since {text!r}: use today, an age (12h, 7d, 2w) or an ISO 8601 date or time "
            "(2026-12-01, 2026-12-01T08:00:00Z)"
        ) from None
    if found.tzinfo is None:
        found = found.replace(tzinfo=UTC)
    return found.timestamp()


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


@command
def usage(
    actor: Annotated[
        str | None, typer.Option("--actor", "-a", help="Only this actor's runs.")
    ] = None,
    since: Annotated[
        str,
        typer.Option(
            "--since",
            help="Runs requested since: today (UTC, the default), an age (12h, 7d) or an ISO "
            "8601 date or time.",
        ),
    ] = "today",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Show what the runs' provider calls used, by actor, agent and model, as pi reported it.

    Example: tether usage --actor user:ana --since 7d
    """
    if actor is not None:
        check_id("actor", actor)
    start = parse_since(since, time.time())
    _, store = open_configured_ledger(config, ledger)
    with store:
        lines = store.usage_totals(actor=actor, since=start)
    total = sum((line.total for line in lines), Usage())
    if as_json:
        body = {
            "since": _iso(start),
            "actor": actor,
            "lines": [line.to_json() for line in lines],
            "total": total.to_json(),
        }
        sys.stdout.write(json.dumps(body, ensure_ascii=False) + "\n")
        return
    _table(lines, start, total)


def _table(lines: list[UsageLine], start: float, total: Usage) -> None:
    table = Table(title=f"usage since {_iso(start)}")
    for key in GROUPS:
        table.add_column(key)
    table.add_column("runs", justify="right")
    table.add_column("calls", justify="right")
    table.add_column("task", justify="right")
    table.add_column("checkpoint", justify="right")
    table.add_column("total", justify="right")
    for line in lines:
        table.add_row(
            *(getattr(line, key) or "" for key in GROUPS),
            str(line.runs),
            str(line.total.calls),
            figure(line.task),
            figure(line.checkpoint),
            figure(line.total),
        )
    console.print(table)
    console.print(f"total: {figure(total)} in {total.calls} provider calls")
