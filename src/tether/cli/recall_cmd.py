"""``tether recall`` and ``tether note``: the twins of the tools a run's agent has
(docs/contracts.md#recall-and-notes)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.exits import command, err_console
from tether.ledger import Note
from tether.recall import RecallAnswer, add_note, read_range, search

__all__ = ["note_app", "recall"]

note_app = typer.Typer(help="Notes an agent keeps for its later runs on a session.")


@command
def recall(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    query: Annotated[
        str | None, typer.Argument(help="Words to search for (ranked full-text search).")
    ] = None,
    first: Annotated[
        int | None, typer.Option("--from", min=1, help="First row (seq) to read.")
    ] = None,
    last: Annotated[int | None, typer.Option("--to", min=1, help="Last row (seq) to read.")] = None,
    actor: Annotated[
        str | None, typer.Option("--actor", help="Who asks (admission uses its grants).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Search a session's retained rows, or read rows FROM..TO, as ACTOR may see them.

    Rows the actor is not admitted to are named by seq, never shown. With --from/--to and a
    QUERY, the search covers only that range. Every answer is at most 16,000 bytes.

    Example: tether recall -s review-42 --actor user:ana "deploy password"

    Example: tether recall -s review-42 --from 10 --to 41 --json
    """
    cfg, store = open_configured_ledger(config, ledger)
    with store:
        answer: RecallAnswer
        if query is not None and query.strip():
            answer = search(
                store,
                session,
                query,
                actor=actor,
                grants=cfg.access.grants,
                first=first,
                last=last,
            )
        else:
            answer = read_range(store, session, first, last, actor=actor, grants=cfg.access.grants)
    if as_json:
        sys.stdout.write(json.dumps(answer.to_json(), ensure_ascii=False) + "\n")
    else:
        Console(highlight=False).print(Text(answer.to_text()), end="")


def _note_json(note: Note) -> dict[str, object]:
    return {
        "session": note.session,
        "agent": note.agent,
        "text": note.text,
        "at": note.at,
        "actor": note.actor,
        "run": note.run,
        "sources": list(note.sources),
    }


@note_app.command("add")
@command
def note_add(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="The agent the note is for.")],
    text: Annotated[str, typer.Argument(help="The note (at most 2,000 bytes).")],
    actor: Annotated[
        str | None, typer.Option("--actor", help="Who the note is attributed to.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the note as JSON.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Keep a note for later runs of AGENT on SESSION (they see the newest notes).

    Example: tether note add -s review-42 -a reviewer "The retry limit stays at 3."
    """
    _, store = open_configured_ledger(config, ledger)
    with store:
        note = add_note(store, session, agent, text, actor=actor)
    if as_json:
        sys.stdout.write(json.dumps(_note_json(note), ensure_ascii=False) + "\n")
    else:
        err_console.print(f"noted for agent {escape(agent)} on session {escape(session)}")


@note_app.command("list")
@command
def note_list(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="Whose notes.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the notes as JSON.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """List the notes of AGENT on SESSION, oldest first.

    Example: tether note list -s review-42 -a reviewer --json
    """
    _, store = open_configured_ledger(config, ledger)
    with store:
        store.get_session(session)
        notes = [n for n in store.all_notes(session) if n.agent == agent]
    if as_json:
        sys.stdout.write(json.dumps([_note_json(n) for n in notes], ensure_ascii=False) + "\n")
        return
    table = Table(expand=True)
    table.add_column("at")
    table.add_column("by")
    table.add_column("note", ratio=1, overflow="fold")
    for n in notes:
        by = " ".join(x for x in (n.actor, n.run) if x)
        table.add_row(Text(n.at), Text(by), Text(n.text))
    Console(highlight=False).print(table)
