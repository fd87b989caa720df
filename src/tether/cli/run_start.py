"""The start of ``tether run``: the request admitted, the ledger open and pi launched (held at
its gate), before the run itself is imported (DESIGN §3.5, §3.7).

pi's start is the largest fixed cost of a run, so it should begin as early as possible. The
``tether`` entry (:mod:`tether.cli.entry`) therefore makes this start from the raw arguments
before it loads the CLI (:func:`head_start`): pi loads while Python imports typer and the
harness. The ``run`` command then :func:`take`-s that start if it was made for the same
arguments, and makes it itself otherwise, so the command, not the head start, decides what the
arguments mean and reports every error.
"""

from __future__ import annotations

import atexit
import contextlib
import getopt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from tether.admission import admit_request
from tether.config import Config, ledger_file, load_config
from tether.ids import check_id, new_run_id
from tether.pi.install import PiInstall, extension_file, find_pi
from tether.pi.launch import PiLaunch, check_workdir

if TYPE_CHECKING:
    from tether.ledger import Ledger

__all__ = ["CONTINUATION_EXTENSION", "RunArgs", "Started", "head_start", "parse", "start", "take"]

CONTINUATION_EXTENSION = extension_file("continuation")

# `tether run`'s options, as getopt spells them (tests check them against the command's own).
SHORT_OPTIONS = "s:a:c:"
LONG_OPTIONS = ("session=", "agent=", "actor=", "json", "workdir=", "no-wait", "config=", "ledger=")


@dataclass(frozen=True, slots=True)
class RunArgs:
    """What ``tether run`` was asked, as far as its start depends on it."""

    request: str
    session: str
    agent: str
    actor: str = "user:local"
    workdir: Path | None = None
    config: Path | None = None
    ledger: str | None = None


@dataclass(slots=True)
class Started:
    """A run's start: everything the run needs before its own code is loaded."""

    args: RunArgs
    config: Config
    text: str
    """The admitted request."""
    pi: PiInstall
    store: Ledger
    run_id: str
    launch: PiLaunch | None
    """pi held at its gate; None when the run starts its own (a busy session waits first, and
    ``custody.detached = false`` runs pi as the harness's child)."""

    def abandon(self) -> None:
        """The run will not happen here: end pi at its gate, remove its directory, close the
        ledger. Never raises."""
        if self.launch is not None:
            self.launch.discard()
        # A ledger that failed to close has nothing left to say here.
        with contextlib.suppress(Exception):
            self.store.close()


def start(args: RunArgs, *, stdin: BinaryIO | None = None) -> Started:
    """Admit the request, start its pi, open the ledger. Admission comes first: a bad id or
    request writes nothing, not even a new ledger file. pi is started before the ledger is
    opened (the ledger's code is the larger part of what this step loads), and given up when the
    session turns out to be busy. Raises ``UsageError``, ``ConfigError``, ``Refused``,
    ``PiNotInstalled`` or the ledger's errors."""
    check_id("session", args.session)
    check_id("agent", args.agent)
    check_id("actor", args.actor)
    cfg = load_config(args.config)
    if args.request == "-":
        if stdin is None:
            raise ValueError("the request is on stdin, and no stdin was given")
        # read up to one byte past the limit: a huge pipe is refused, not held
        raw: str | bytes = stdin.read(cfg.followup.request_limit + 1)
    else:
        raw = args.request
    text = admit_request(raw, cfg.followup)
    pi = find_pi()  # before the ledger is opened: nothing is created when pi is missing
    url = args.ledger or cfg.ledger.url
    run_id = new_run_id()
    launch = _launch(cfg, args, url, run_id, pi)
    try:
        # Imported only now: pi loads meanwhile.
        from tether.ledger import open_ledger

        store = open_ledger(url)
        try:
            busy = launch is not None and not store.session_free(args.session)
        except BaseException:
            store.close()
            raise
    except BaseException:
        if launch is not None:
            launch.discard()
        raise
    if launch is not None and busy:
        # The request waits its turn, and its pi starts then: a waiting request holds none.
        launch.discard()
        launch = None
    return Started(args, cfg, text, pi, store, run_id, launch)


def _launch(
    cfg: Config, args: RunArgs, ledger_url: str, run_id: str, pi: PiInstall
) -> PiLaunch | None:
    """pi for this request, started now under custody's keeper and held at its gate; None
    without custody (the run starts pi as its child). A workdir holding the ledger, the config
    or the run directories, or a missing provider key, is refused first."""
    if not cfg.custody.detached:
        return None
    workdir = check_workdir(
        args.workdir or cfg.workdir(args.agent),
        agent=args.agent,
        config=cfg,
        ledger_path=ledger_file(ledger_url),
    )
    try:
        return PiLaunch.start(
            cfg,
            args.agent,
            pi=pi,
            run_id=run_id,
            workdir=workdir,
            extensions=(CONTINUATION_EXTENSION,),
        )
    except OSError:
        return None  # the run tries again, and fails with pi's startup error


def parse(argv: Sequence[str]) -> RunArgs | None:
    """``tether run``'s arguments read without the CLI, or None where they are not plain
    (help, an unknown option, no request or several). Only a guess at what the command will
    make of them: :func:`take` gives the start only to the same arguments."""
    try:
        opts, rest = getopt.gnu_getopt(list(argv), SHORT_OPTIONS, list(LONG_OPTIONS))
    except getopt.GetoptError:
        return None
    if len(rest) != 1:
        return None
    given: dict[str, str] = {}
    for flag, value in opts:
        given[{"-s": "--session", "-a": "--agent", "-c": "--config"}.get(flag, flag)] = value
    if "--session" not in given or "--agent" not in given:
        return None
    config, workdir = given.get("--config"), given.get("--workdir")
    return RunArgs(
        request=rest[0],
        session=given["--session"],
        agent=given["--agent"],
        actor=given.get("--actor", "user:local"),
        workdir=Path(workdir) if workdir is not None else None,
        config=Path(config) if config is not None else None,
        ledger=given.get("--ledger"),
    )


_head: Started | None = None


def head_start(argv: Sequence[str]) -> None:
    """Start the run ``tether run ARGV`` asks for, before the CLI is loaded; silently nothing
    when the arguments are not plain, the request is on stdin, or the start fails (the command
    makes it again, and says what is wrong). A start the command does not take is abandoned at
    exit."""
    global _head
    args = parse(argv)
    if args is None or args.request == "-":
        return
    try:
        _head = start(args)
    except Exception:
        return
    atexit.register(_abandon_head)


def take(args: RunArgs) -> Started | None:
    """The head start, if it was made for ``args`` (else it is abandoned, and None)."""
    global _head
    head, _head = _head, None
    if head is None:
        return None
    if head.args == args:
        return head
    head.abandon()
    return None


def _abandon_head() -> None:
    global _head
    head, _head = _head, None
    if head is not None:
        head.abandon()
