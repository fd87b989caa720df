"""``tether ledger load|dump|copy``, ``tether log``, ``tether sessions``,
``tether session clear``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.counts import counted, counts
from tether.cli.exits import command
from tether.errors import UsageError
from tether.ids import check_id
from tether.ledger import Row, RowKind, Run, open_ledger
from tether.ledger.copy import copy_sessions
from tether.ledger.jsonl import dump_session, load_file, row_record, run_record
from tether.usage import recorded_usage, usage_text

ledger_app = typer.Typer(
    rich_markup_mode=None,  # help text is plain: "[followup]" is not markup
    help="Move sessions in and out of the ledger as JSON Lines.",
    no_args_is_help=True,
)
session_app = typer.Typer(
    rich_markup_mode=None,  # help text is plain: "[followup]" is not markup
    help="Operate on one session.",
    no_args_is_help=True,
)
console = Console(highlight=False, soft_wrap=True)


@ledger_app.command("load")
@command
def load(
    file: Annotated[Path, typer.Argument(help="A ledger JSONL file (the interchange format).")],
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Load a JSONL file in one transaction; a bad file writes nothing.

    Example: tether ledger load examples/review.jsonl
    """
    _, store = open_configured_ledger(config, ledger)
    with store:
        report = load_file(store, file)
    console.print(
        f"loaded {counts((report.sessions, 'session'), (report.runs, 'run'))}, "
        f"{counts((report.rows, 'row'), (report.notes, 'note'))} from {file}"
    )


@ledger_app.command("dump")
@command
def dump(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Write a session as JSONL to stdout.

    Example: tether ledger dump --session s1 > s1.jsonl
    """
    check_id("session", session)
    _, store = open_configured_ledger(config, ledger)
    with store:
        dump_session(store, session, sys.stdout)


@ledger_app.command("copy")
@command
def copy_(
    src: Annotated[str, typer.Argument(help="Ledger URL to copy from.")],
    dst: Annotated[str, typer.Argument(help="Ledger URL to copy into.")],
    session: Annotated[
        list[str] | None,
        typer.Option("--session", "-s", help="Session id (repeat; default: every session)."),
    ] = None,
) -> None:
    """Copy sessions exactly (runs, rows, notes, receipts) between ledgers, in one transaction;
    refuses, writing nothing, when a destination session is not empty.

    Example: tether ledger copy sqlite:///var/lib/tether/ledger.db postgresql://tether@db/tether
    """
    with open_ledger(src) as source, open_ledger(dst) as target:
        report = copy_sessions(source, target, session or None)
    copied = [(report.sessions, "session"), (report.runs, "run"), (report.rows, "row")]
    copied.append((report.notes, "note"))
    if report.forks:
        copied.append((report.forks, "fork kept as a fork"))
    if report.erasures:
        copied.append((report.erasures, "erasure receipt"))
    console.print(f"copied {counts(*copied)}")


def _summary(row: Row, width: int = 90) -> str:
    body = row.body
    if row.kind is RowKind.COMPACTION:
        cont = body.get("continuation")
        label = "checkpoint" if cont else "compaction"
        text = f"[{label} covers ≤{body.get('covers_to')}] {body.get('summary', '')}"
    elif row.kind is RowKind.RECEIPT:
        text = f"[receipt {body.get('kind')}: {body.get('reason', '')}]"
    else:
        parts: list[str] = []
        content = body.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for block in content:
                t = block.get("type")
                if t == "text":
                    parts.append(block.get("text", ""))
                elif t == "toolCall":
                    parts.append(f"→ {block.get('name')}({json.dumps(block.get('arguments'))})")
                elif t == "image":
                    parts.append("[image]")
                elif t == "thinking":
                    parts.append("(thinking)")
        text = " ".join(parts)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


_RUN_HEAD = ("type", "id", "session", "agent", "status", "request_seq", "started", "ended")
# What the human form says of a run, in every line of --json (null when the run has none).
_RUN_FACTS = ("stop_reason", "error", "checkpoint", "checkpoint_decision", "limits_hit")


def _run_line(run: Run) -> dict[str, Any]:
    """A run of ``tether log --json``: its interchange ``run`` record (the fields ``tether
    ledger dump`` writes, the record's extras among them), led by what the human form says of
    it, each null when the run has none: how it ended (``stop_reason``, ``error``), its
    checkpoint and the decision taken on it (``checkpoint``, ``checkpoint_decision``), the
    sandbox limits its tools hit (``limits_hit``), and what its provider calls used
    (``usage``, tether.usage; null before it ended)."""
    rec = run_record(run)
    head = {k: rec.pop(k, None) for k in _RUN_HEAD}
    facts = {k: rec.pop(k, None) for k in _RUN_FACTS}
    rec.pop("usage", None)
    found = recorded_usage(run.extra)
    return {**head, **facts, "usage": found.to_json() if found is not None else None, **rec}


MAX_COUNT = 2**63 - 1
"""The largest seq or count a ledger stores (SQLite's and PostgreSQL's 64-bit integers)."""


@command
def log(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    limit: Annotated[int, typer.Option(min=1, help="Show at most the last N rows.")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON record per line.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Show a session's timeline: runs and their rows.

    Example: tether log --session s1
    """
    check_id("session", session)
    if limit > MAX_COUNT:
        # the ledger's integers are 64-bit: a larger one would fail in the driver, not here
        raise UsageError(f"--limit {limit} is over {MAX_COUNT}, the most rows a ledger can hold")
    _, store = open_configured_ledger(config, ledger)
    with store:
        store.get_session(session)
        last = store.last_seq(session)
        rows = store.rows_range(session, max(1, last - limit + 1), last, limit=limit)
        runs = {r.id: r for r in store.runs(session)}
    if as_json:
        for run in runs.values():
            sys.stdout.write(json.dumps(_run_line(run), ensure_ascii=False) + "\n")
        for row in rows:
            sys.stdout.write(json.dumps(row_record(row), ensure_ascii=False) + "\n")
        return
    shown = f"{counted(last, 'row')}, {counted(len(runs), 'run')}"
    table = Table(title=f"session {session} ({shown})", expand=True)
    # Here, not at the top: the other ledger commands do not pay for loading the harness.
    from tether.harness.turn import decision_text
    from tether.sandbox.limits import limits_text

    for run in runs.values():
        decided = decision_text(run.extra)
        limits = limits_text(run.extra)
        used = usage_text(run.extra)
        console.print(
            Text(
                f"run {run.id}: {run.agent} {run.status.value}"
                + (f" ({stop})" if (stop := run.extra.get("stop_reason")) else "")
                + f", request seq {run.request_seq}, "
                f"{run.started or '?'} → {run.ended or '…'}"
                + (f"; checkpoint {decided}" if decided else "")
                + (f"; limits hit: {limits}" if limits else "")
                + (f"; usage {used}" if used else "")
            )
        )
    table.add_column("seq", justify="right")
    table.add_column("run")
    table.add_column("actor")
    table.add_column("kind")
    table.add_column("bytes", justify="right")
    table.add_column("content", ratio=1, overflow="ellipsis", no_wrap=True)
    for row in rows:
        kind = row.role or row.kind.value
        if isinstance(origin := row.extra.get("origin"), int):
            # A follow-up view's copy (of the previous request, say), not someone asking again.
            kind += f" (copy of #{origin})"
        style = {"compaction": "bold green", "receipt": "bold yellow"}.get(row.kind.value, "")
        table.add_row(
            str(row.seq),
            row.run or "",
            row.actor,
            kind,
            str(row.bytes),
            Text(_summary(row)),
            style=style,
        )
    console.print(table)


@command
def sessions(
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """List the sessions in the ledger.

    Example: tether sessions
    """
    _, store = open_configured_ledger(config, ledger)
    with store:
        found = [(s, store.last_seq(s.id)) for s in store.sessions()]
    if as_json:
        for s, last in found:
            sys.stdout.write(
                json.dumps({"id": s.id, "created": s.created, "rows": last, "refusing": s.refusing})
                + "\n"
            )
        return
    table = Table(title="sessions")
    table.add_column("id")
    table.add_column("created")
    table.add_column("rows", justify="right")
    table.add_column("refusing")
    for s, last in found:
        table.add_row(s.id, s.created, str(last), s.refusing or "")
    console.print(table)


@session_app.command("clear")
@command
def clear(
    session: Annotated[str, typer.Argument(help="Session id.")],
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Let a refusing session take prompts again (after checking pi's state by hand).

    Example: tether session clear s1
    """
    check_id("session", session)
    _, store = open_configured_ledger(config, ledger)
    with store:
        store.set_refusing(session, None)
    console.print(f"session {session} takes prompts again")
