"""``tether run``: one task turn of an agent on a session (docs/cli.md#tether-run).

The command admits the request and starts pi at once (held at its gate, :mod:`tether.pi.gate`);
what the run needs beyond that is imported while pi loads (:mod:`tether.cli.run_live`). The
``tether`` program runs plain arguments without this command (:mod:`tether.cli.run_start`): it
is for the rest (help, stdin, mistakes, which it reports) and for callers of the CLI's API.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from tether.admission import Refused
from tether.cli import run_start
from tether.cli.common import ConfigOpt, LedgerOpt
from tether.cli.exits import command
from tether.cli.run_start import RunArgs

__all__ = ["run"]


def _refused(reason: str, detail: str, as_json: bool) -> NoReturn:
    from tether.cli.run_live import refused

    refused(reason, detail, as_json)


@command
def run(
    request: Annotated[str, typer.Argument(help="The request for the agent ('-' reads stdin).")],
    session: Annotated[
        str, typer.Option("--session", "-s", help="Session id (created on first use).")
    ],
    agent: Annotated[str, typer.Option("--agent", "-a", help="Agent name from the config.")],
    actor: Annotated[
        str, typer.Option("--actor", help="Who is asking, e.g. user:ana.")
    ] = "user:local",
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"run","session","status","answer","checkpoint"}.')
    ] = False,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where the agent's tools run (default: here).")
    ] = None,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="Refuse (exit 3, session_busy) instead of waiting."),
    ] = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Run one task turn of an agent on a session and print its answer.

    Exit status: 0 finished, 1 the ledger failed before the run started, 2 usage or
    configuration error, 3 refused, 4 the run failed or was stopped, 5 another owner took the
    run over. Ctrl-C stops the run (abort, then wait for pi); a second Ctrl-C kills pi.

    Example: tether run --session s1 --agent reviewer "Review the last commit"
    """
    args = RunArgs(
        request, session, agent, actor, workdir, config, ledger, as_json=as_json, wait=not no_wait
    )
    try:
        started = run_start.start(args, stdin=sys.stdin.buffer)
    except Refused as exc:
        _refused(exc.reason.value, exc.detail, as_json)
    # The run itself (anyio, the harness, the mirror) is imported only now: pi loads meanwhile.
    from tether.cli.run_live import run_started

    run_started(started)
