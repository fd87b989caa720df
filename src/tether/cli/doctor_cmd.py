"""``tether doctor``: one table of what a run needs and whether it is there."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tether.cli.common import ConfigOpt, LedgerOpt
from tether.cli.exits import Exit, command

__all__ = ["doctor"]


@command
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Check what a run needs and whether it is there; exits 0 only when nothing is missing.

    One line each: Python, tether, Node and pi, the extension, the ledger (reachable, its
    schema), each configured provider (answering on its base URL), the state directory's mode.

    Example: tether doctor
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tether.config import load_config
    from tether.doctor import Status, run_checks

    checks = run_checks(load_config(config), ledger)
    ok = not any(c.status.blocks for c in checks)
    if as_json:
        print(json.dumps({"ok": ok, "checks": [c.to_json() for c in checks]}, ensure_ascii=False))
    else:
        mark = {Status.OK: "[green]✓[/]", Status.WARN: "[yellow]![/]", Status.FAIL: "[red]✗[/]"}
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for column in ("", "check", "found", "what to do"):
            table.add_column(column, overflow="fold")
        for c in checks:
            table.add_row(mark[c.status], c.name, escape(c.found), escape(c.fix))
        Console(highlight=False).print(table)
    if not ok:
        raise typer.Exit(Exit.ERROR)
