"""``tether fork``, ``tether erase`` and ``tether retention apply``."""

from __future__ import annotations

import getpass
import json
from typing import Annotated

import anyio
import typer

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.counts import counted
from tether.cli.exits import Exit, command, err_console, escape
from tether.errors import SessionBusy, UsageError, WorkspaceError
from tether.harness.custody.erasing import DEFAULT_STOP_GRACE_S, erase_stopping, retention_stopping
from tether.ledger.lifecycle import Erased, Selector, SelectorKind
from tether.pi.workspace import fork_workspace

__all__ = ["erase", "fork", "retention_app"]

retention_app = typer.Typer(
    rich_markup_mode=None,  # help text is plain: "[retention]" is not markup
    help="Erase sessions idle longer than [retention] idle_days.",
    no_args_is_help=True,
)

ActorOpt = Annotated[
    str | None,
    typer.Option("--actor", help="Who erases, for the receipt (default: cli:<your user name>)."),
]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="List exactly what would be erased; erase nothing.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
StopGraceOpt = Annotated[
    float,
    typer.Option(
        "--stop-grace",
        min=0,
        help="Seconds a live run is given to settle after a soft stop before it is stopped hard.",
    ),
]


def _progress(line: str) -> None:
    err_console.print(escape(line))


def _actor(given: str | None) -> str:
    return given or f"cli:{getpass.getuser()}"


# An erasure's counts (its --json "counts" keys) as its line says them: (singular, plural).
_COUNTED = {
    "sessions": ("session", "sessions"),
    "rows": ("row", "rows"),
    "checkpoints": ("checkpoint", "checkpoints"),
    "notes": ("note", "notes"),
    "runs": ("run", "runs"),
    "scrubbed_runs": ("run scrubbed", "runs scrubbed"),
    "run_dirs": ("run directory", "run directories"),
    "workspaces": ("workspace", "workspaces"),
}


def _asking() -> bool:
    """Whether a person is at the terminal to confirm (a script's erase, without a terminal
    on stdin, goes ahead as it always has)."""
    import sys

    return sys.stdin.isatty() and sys.stderr.isatty()


def _say(done: Erased) -> None:
    counts = ", ".join(
        counted(n, *_COUNTED.get(what, (what, what))) if what != "queued" else f"{n} queued"
        for what, n in done.to_json()["counts"].items()
        if n
    )
    verb = "would erase" if done.receipt is None else "erased"
    selector = " ".join(f"{k} {v}" for k, v in done.plan.selector.to_json().items())
    line = f"{verb} {selector}: {counts or 'nothing'}"
    if done.receipt is not None:
        line += f" (receipt {done.receipt.id})"
    print(line)
    for session, seqs in done.plan.rows.items():
        print(f"  session {session}: rows {_ranges(seqs)}")
    for run in done.stopped:
        if done.receipt is None:
            print(f"  would stop run {run['run']} (live on session {run['session']})")
        else:
            print(
                f"  stopped run {run['run']} first ({run['how']}): {run['status']}, "
                f"{run['stop_reason']}"
            )


def _ranges(seqs: list[int]) -> str:
    parts: list[str] = []
    start = prev = seqs[0]
    for s in seqs[1:]:
        if s != prev + 1:
            parts.append(f"{start}..{prev}" if prev != start else str(start))
            start = s
        prev = s
    parts.append(f"{start}..{prev}" if prev != start else str(start))
    return ", ".join(parts)


@command
def fork(
    session: Annotated[str, typer.Option("--session", "-s", help="The session to fork.")],
    at: Annotated[str, typer.Option("--at", help="The run whose end the fork begins at.")],
    new: Annotated[str, typer.Option("--new", "-n", help="The new session's id.")],
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Begin a new session as SESSION up to the end of a run, by reference (nothing copied).

    Views, recall and exports of the new session see those rows and its own; its runs,
    checkpoints and notes are its own; SESSION is unchanged. SESSION's workspace, as it is
    now, is copied for it (a git worktree: a new branch from SESSION's, its changes copied).

    Example: tether fork -s s1 --at r-1a2b3c -n s1-retry
    """
    cfg, store = open_configured_ledger(config, ledger)
    with store:
        made = store.fork_session(session, at, new)
        inherited = store.last_seq(made.id)
    try:
        copied = fork_workspace(cfg, session, made.id)
    except WorkspaceError as exc:
        raise WorkspaceError(
            f"session {made.id} was forked from {session}, but {session}'s workspace was not "
            f"copied for it ({exc}); its first run makes one from the agent's workdir"
        ) from exc
    if as_json:
        print(json.dumps({"session": made.id, "from": session, "at_run": at, "seq": inherited}))
    else:
        print(f"session {made.id}: {session} up to row {inherited} (the end of run {at})")
        if copied is not None:
            branch = f", on branch {copied.branch}" if copied.branch else ""
            print(f"its workspace: a copy of {session}'s as it is now{branch}")


@command
def erase(
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Erase this session whole.")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option("--source", help="Erase every row carrying this source, and what derives."),
    ] = None,
    dry_run: DryRunOpt = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Erase without asking (on a terminal it shows the plan and asks)."
        ),
    ] = False,
    stop_grace: StopGraceOpt = DEFAULT_STOP_GRACE_S,
    as_json: JsonOpt = False,
    actor: ActorOpt = None,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Erase a session, or a source and everything derived from it, keeping a receipt.

    With --source: every row whose sources include it, the rows of a run whose request goes,
    the checkpoints that cover an erased row, notes that carry it, the answers kept in run
    records, and the run directories (pi's session files) of the runs touched. A run live on an
    affected session is stopped first, wherever it runs (soft, then hard after --stop-grace);
    the sessions take no new run meanwhile. --dry-run stops nothing.

    Example: tether erase --source repo:x --dry-run
    """
    if (session is None) == (source is None):
        raise UsageError("give exactly one of --session S or --source SRC")
    selector = (
        Selector(SelectorKind.SESSION, session)
        if session is not None
        else Selector(SelectorKind.SOURCE, source or "")
    )
    cfg, store = open_configured_ledger(config, ledger)
    with store:
        try:
            if not (dry_run or yes) and _asking():
                # On a terminal: the plan first, then nothing happens without a yes.
                plan = anyio.run(
                    lambda: erase_stopping(
                        store, cfg, selector, actor=_actor(actor), dry_run=True, say=_progress
                    )
                )
                if plan is not None:
                    _say(plan)
                if not typer.confirm("Erase this? It cannot be undone", default=False):
                    err_console.print("nothing erased")
                    raise SystemExit(Exit.OK)
            done = anyio.run(
                lambda: erase_stopping(
                    store,
                    cfg,
                    selector,
                    actor=_actor(actor),
                    stop_grace_s=stop_grace,
                    dry_run=dry_run,
                    say=_progress,
                )
            )
        except SessionBusy as exc:
            err_console.print(f"[bold red]refused:[/] {escape(str(exc))}")
            raise SystemExit(Exit.REFUSED) from None
    assert done is not None  # only retention passes a session by
    if as_json:
        print(json.dumps(done.to_json(), ensure_ascii=False))
    else:
        _say(done)


@retention_app.command("apply")
@command
def apply(
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
    actor: ActorOpt = None,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Erase every session idle for [retention] idle_days, one receipt each.

    Example: tether retention apply --dry-run
    """
    cfg, store = open_configured_ledger(config, ledger)
    days = cfg.retention.idle_days
    if days is None:
        raise UsageError(
            f"no [retention] idle_days in {cfg.path or 'the configuration'}: set it to the days "
            "a session may stay idle before it is erased"
        )
    with store:
        done = anyio.run(
            lambda: retention_stopping(
                store, cfg, days, actor=_actor(actor), dry_run=dry_run, say=_progress
            )
        )
    if as_json:
        print(json.dumps([d.to_json() for d in done], ensure_ascii=False))
        return
    for d in done:
        _say(d)
    if not done:
        err_console.print(f"no session idle for {counted(days, 'day')}")
