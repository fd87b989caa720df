"""``tether import pi`` and ``tether export pi``: pi session files in and out."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.counts import counted
from tether.cli.exits import command
from tether.interop import LeftOut, export_pi, import_pi

__all__ = ["export_app", "import_app"]

import_app = typer.Typer(
    help="Bring sessions of other tools into the ledger.", no_args_is_help=True
)
export_app = typer.Typer(
    help="Write ledger sessions in other tools' formats.", no_args_is_help=True
)
console = Console(highlight=False, stderr=True)

# What an import left out, as a count says it: (singular, plural).
_LEFT_OUT = {
    LeftOut.OFF_BRANCH: ("entry off the branch", "entries off the branch"),
    LeftOut.CONTEXT_EDIT: ("context edit", "context edits"),
    LeftOut.OMITTED_BY_EDIT: ("entry an edit omitted", "entries an edit omitted"),
    LeftOut.MALFORMED: ("malformed line", "malformed lines"),
}


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
    left = ", ".join(counted(n, *_LEFT_OUT[k]) for k, n in report.left_out.items())
    kept = sum(report.bookkeeping.values())
    console.print(
        f"imported {counted(report.rows, 'row')} in {counted(report.runs, 'run')} into session "
        f"{session} ({counted(report.compactions, 'compaction')}, {report.edited} edited, "
        f"{counted(kept, 'bookkeeping entry')} kept) from {counted(report.entries, 'entry')} of "
        f"{file} (format v{report.version}); left out: {left or 'nothing'}"
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
        f"exported {counted(report.rows, 'row')} and {counted(report.runs, 'run')} of session "
        f"{session} as {counted(report.entries, 'pi entry')}; not in the file: "
        f"{counted(report.runs_left_out, 'run')} not ended, sources of "
        f"{counted(report.rows_with_sources, 'row')}, {counted(report.notes, 'note')}"
    )
