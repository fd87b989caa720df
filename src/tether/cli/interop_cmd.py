"""``tether import pi`` and ``tether export pi``: pi session files in and out (DESIGN §3.11)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.exits import command
from tether.interop import export_pi, import_pi

__all__ = ["export_app", "import_app"]

import_app = typer.Typer(
    help="Bring sessions of other tools into the ledger.", no_args_is_help=True
)
export_app = typer.Typer(
    help="Write ledger sessions in other tools' formats.", no_args_is_help=True
)
console = Console(highlight=False, stderr=True)


@import_app.command("pi")
@command
def import_pi_cmd(
    file: Annotated[Path, typer.Argument(help="A pi session file (.jsonl, format v1, v2 or v3).")],
    session: Annotated[str, typer.Option("--session", "-s", help="New session id.")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="Agent the imported runs are of.")],
    actor: Annotated[
        str | None, typer.Option("--actor", help="Actor of the user messages (default user:pi).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Import a pi session file's active branch as a new session, in one transaction.

    One run per user message that starts a turn; pi's compactions become compaction rows;
    context edits are applied; bookkeeping entries are kept; what is left out is reported.

    Example: tether import pi ~/.pi/agent/sessions/--src--/s.jsonl -s review-42 -a reviewer
    """
    _, store = open_configured_ledger(config, ledger)
    with store:
        report = import_pi(store, file, session=session, agent=agent, actor=actor)
    if as_json:
        sys.stdout.write(json.dumps(report.to_json()) + "\n")
        return
    left = ", ".join(f"{n} {k.value.replace('_', ' ')}" for k, n in report.left_out.items())
    kept = sum(report.bookkeeping.values())
    console.print(
        f"imported {report.rows} rows in {report.runs} runs into session {session} "
        f"({report.compactions} compactions, {report.edited} edited, {kept} bookkeeping "
        f"entries kept) from {report.entries} entries of {file} (format v{report.version}); "
        f"left out: {left or 'nothing'}"
    )


@export_app.command("pi")
@command
def export_pi_cmd(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Write a session as a pi session file (v3) that `pi --session FILE` opens and continues.

    Example: tether export pi --session review-42 -o review-42.jsonl
    """
    _, store = open_configured_ledger(config, ledger)
    with store:
        store.get_session(session)  # a missing session leaves no empty file behind
        if output is None:
            report = export_pi(store, session, sys.stdout)
        else:
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w", encoding="utf-8", newline="\n") as out:
                report = export_pi(store, session, out)
    if as_json:
        console.print_json(json.dumps(report.to_json()))
        return
    console.print(
        f"exported {report.rows} rows of session {session} as {report.entries} pi entries; "
        f"not in the file: {report.runs} run records, sources of {report.rows_with_sources} "
        f"rows, {report.notes} notes"
    )
