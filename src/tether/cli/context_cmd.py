"""``tether context``: the view a new run would be given, without writing anything."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.exits import Exit, command, err_console
from tether.followup import Refusal, build_view

__all__ = ["context"]


@command
def context(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="The agent the next run is for.")],
    actor: Annotated[
        str | None, typer.Option("--actor", help="Who asks (admission uses its grants).")
    ] = None,
    request: Annotated[
        str | None, typer.Option("--request", help="The new request (outside the budget).")
    ] = None,
    budget: Annotated[
        int | None, typer.Option("--budget", min=1, help="Bytes (default: [followup] budget).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the view as JSON.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Show exactly what a new run of AGENT on SESSION would be given; writes nothing.

    Exits 3 when the view is refused (with --json, the refusal is printed as JSON).

    Example: tether context --session review-42 --agent reviewer --actor user:ana --json
    """
    cfg, store = open_configured_ledger(config, ledger)
    with store:
        view = build_view(
            store,
            session=session,
            agent=agent,
            actor=actor,
            request=request,
            budget=budget,
            config=cfg.followup,
            grants=cfg.access.grants,
        )
    if as_json:
        sys.stdout.write(json.dumps(view.to_json(), ensure_ascii=False) + "\n")
    else:
        from rich.console import Console  # for people only: --json does without rich

        from tether.followup.render import render_refusal, render_view

        if isinstance(view, Refusal):
            render_refusal(view, err_console)
        else:
            render_view(view, Console(highlight=False))  # made now: the terminal's width now
    if isinstance(view, Refusal):
        raise typer.Exit(Exit.REFUSED)
