"""``tether context``: the view a new run would be given, without writing anything."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from tether.admission import admit_request
from tether.cli.common import ConfigOpt, LedgerOpt
from tether.cli.exits import Exit, command, err_console
from tether.config import load_config
from tether.followup import FollowupView, Refusal, Refused, build_view
from tether.ids import check_id
from tether.ledger import open_ledger

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
    check_id("session", session)
    check_id("agent", agent)
    if actor is not None:
        check_id("actor", actor)
    cfg = load_config(config)
    if request is not None:
        try:
            request = admit_request(request, cfg.followup)
        except Refused as exc:
            view: FollowupView | Refusal = Refusal(exc.reason, exc.detail)
            _show(view, as_json)
    store = open_ledger(ledger or cfg.ledger.url)
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
    _show(view, as_json)


def _show(view: FollowupView | Refusal, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(view.to_json(), ensure_ascii=False) + "\n")
    else:
        from rich.console import Console  # for people only: --json does without rich

        from tether.cli.context_render import render_refusal, render_view

        if isinstance(view, Refusal):
            render_refusal(view, err_console)
        else:
            render_view(view, Console(highlight=False))  # made now: the terminal's width now
    if isinstance(view, Refusal):
        raise typer.Exit(Exit.REFUSED)
