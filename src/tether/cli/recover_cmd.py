"""``tether recover``: reconcile every live run whose custody lapsed
(docs/architecture.md#custody)."""

from __future__ import annotations

import json
from typing import Annotated

import anyio
import typer
from rich.console import Console
from rich.markup import escape as esc

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.exits import command, err_console
from tether.events import Resumed, RunEvent
from tether.harness.custody.reconcile import Resolution, reconcile

__all__ = ["recover"]

out_console = Console(highlight=False, soft_wrap=True)


@command
def recover(
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Only this session (default: all).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run.")] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Reconcile live runs whose lease expired or whose harness is gone.

    Resume them on their original pi when it still runs here, end them (harness_lost) when pi
    is gone, or end them with unconfirmed_ending and make the session refuse prompts when
    their placement cannot be confirmed (clear it with `tether session clear`).

    Example: tether recover
    """
    cfg, store = open_configured_ledger(config, ledger)

    def say(event: RunEvent) -> None:
        if isinstance(event, Resumed) and not as_json:
            err_console.print(f"resuming run {event.run} on pi pid {event.pi_pid}")

    with store:
        done = anyio.run(lambda: reconcile(store, cfg, session=session, subscribers=(say,)))
    for item in done:
        if as_json:
            out_console.out(json.dumps(item.to_json(), ensure_ascii=False))
            continue
        line = f"run {item.run} (session {item.session}): {item.resolution.value}"
        if item.outcome is not None:
            line += f", {item.outcome.status.value}"
            if item.outcome.answer:
                line += f": {item.outcome.answer[:200]}"
        elif item.detail:
            line += f": {item.detail}"
        style = "yellow" if item.resolution is Resolution.UNCONFIRMED_ENDING else ""
        out_console.print(f"[{style}]{esc(line)}[/]" if style else esc(line))
    if not done and not as_json:
        err_console.print("nothing to recover")
