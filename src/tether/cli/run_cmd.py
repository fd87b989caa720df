"""``tether run``: one task turn of an agent on a session (DESIGN §3.5).

The command admits the request and starts pi at once (held at its gate, :mod:`tether.pi.gate`);
what the run needs beyond that is imported while pi loads (:mod:`tether.cli.run_live`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from tether.cli.common import ConfigOpt, LedgerOpt
from tether.cli.exits import Exit, command, err_console
from tether.cli.exits import escape as esc
from tether.config import Config, load_config
from tether.followup.admission import admit_request
from tether.followup.view import Refused
from tether.ledger import Ledger, open_ledger
from tether.ledger.ids import check_id, new_run_id
from tether.pi.errors import PiNotInstalled
from tether.pi.install import PiInstall, extension_file, find_pi
from tether.pi.launch import PiLaunch, check_workdir

__all__ = ["run"]

CONTINUATION_EXTENSION = extension_file("continuation")


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

    Exit status: 0 finished, 2 usage or configuration error, 3 refused, 4 the run failed or was
    stopped. Ctrl-C stops the run (abort, then wait for pi); a second Ctrl-C kills pi.

    Example: tether run --session s1 --agent reviewer "Review the last commit"
    """
    # Admission comes first: a bad id or request writes nothing, not even a new ledger file.
    check_id("session", session)
    check_id("agent", agent)
    check_id("actor", actor)
    cfg = load_config(config)
    try:
        # stdin is read up to one byte past the limit: a huge pipe is refused, not held
        raw = sys.stdin.buffer.read(cfg.followup.request_limit + 1) if request == "-" else request
        text = admit_request(raw, cfg.followup)
    except Refused as exc:
        _refused(exc.reason.value, exc.detail, as_json)
    try:
        pi = find_pi()  # before the ledger is opened: nothing is created when pi is missing
    except PiNotInstalled as exc:
        err_console.print(f"[bold red]pi is not installed:[/] {esc(str(exc))}")
        raise typer.Exit(Exit.USAGE) from None
    store = open_ledger(ledger or cfg.ledger.url)
    run_id = new_run_id()
    launch = _start_pi(store, cfg, session, agent, workdir, run_id, pi)
    # The run itself (anyio, the harness, the mirror) is imported only now: pi loads meanwhile.
    from tether.cli.run_live import execute

    execute(
        store,
        cfg,
        session=session,
        agent=agent,
        text=text,
        actor=actor,
        workdir=workdir,
        run_id=run_id,
        extensions=(CONTINUATION_EXTENSION,),
        pi=pi,
        as_json=as_json,
        wait=not no_wait,
        launch=launch,
    )


def _start_pi(
    store: Ledger,
    cfg: Config,
    session: str,
    agent: str,
    workdir: Path | None,
    run_id: str,
    pi: PiInstall,
) -> PiLaunch | None:
    """pi for this request, started now and held at its gate until the run is ready (under
    custody's keeper; without custody, the run starts its own pi). A workdir holding the
    ledger, the config or the run directories, or a missing provider key, is refused first.
    Not when the session is busy: the request waits its turn, and its pi starts then."""
    if not cfg.custody.detached or not store.session_free(session):
        return None
    checked = check_workdir(
        workdir or cfg.workdir(agent), agent=agent, config=cfg, ledger_path=store.path
    )
    try:
        return PiLaunch.start(
            cfg,
            agent,
            pi=pi,
            run_id=run_id,
            workdir=checked,
            extensions=(CONTINUATION_EXTENSION,),
        )
    except OSError:
        return None  # the run tries again, and fails with pi's startup error
