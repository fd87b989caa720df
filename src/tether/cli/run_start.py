"""The start of ``tether run``: the request admitted, the ledger open and pi launched (held at
its gate), before the run itself is imported (docs/cli.md#tether-run, docs/architecture.md#custody).

pi's start is the largest fixed cost of a run, so it should begin as early as possible. The
``tether`` entry (:mod:`tether.cli.entry`) therefore makes this start from the raw arguments
(:func:`head_start`) and, when they are plain (:func:`parse` reads them exactly as the command
would), runs it without loading the CLI at all: pi loads while Python imports the harness.
Arguments that are not plain, and any start that fails, go to the ``run`` command
(:mod:`tether.cli.run_cmd`), which makes the start itself and reports what is wrong.
"""

from __future__ import annotations

import contextlib
import getopt
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import msgspec

from tether import telemetry
from tether.admission import admit_request
from tether.config import Config, ledger_file, load_config
from tether.ids import check_id, new_run_id
from tether.pi.agentdir import provider_keys
from tether.pi.install import PiInstall, extension_file, find_pi
from tether.pi.launch import PiLaunch
from tether.pi.workspace import run_workdir

if TYPE_CHECKING:
    from tether.ledger import Ledger

__all__ = ["CONTINUATION_EXTENSION", "RunArgs", "Started", "head_start", "parse", "start"]

CONTINUATION_EXTENSION = extension_file("continuation")

# `tether run`'s options, as getopt spells them (tests check them against the command's own).
SHORT_OPTIONS = "s:a:c:"
LONG_OPTIONS = ("session=", "agent=", "actor=", "json", "workdir=", "no-wait", "config=", "ledger=")


# msgspec structs rather than dataclasses here: this module is imported before pi is started, and
# msgspec is loaded already (the config), where dataclasses would cost the start about 10 ms.
class RunArgs(msgspec.Struct, frozen=True):
    """What ``tether run`` was asked."""

    request: str
    session: str
    agent: str
    actor: str = "user:local"
    workdir: Path | None = None
    config: Path | None = None
    ledger: str | None = None
    as_json: bool = False
    wait: bool = True


class Started(msgspec.Struct):
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
    if telemetry.wanted():
        # OpenTelemetry's SDK takes a while to import: in a thread, while pi loads and the
        # harness is imported; the run's first span waits for it (setup's lock). The exporter
        # is loaded only when spans are due (telemetry.deferred), which a short run never is.
        threading.Thread(target=telemetry.tracer, daemon=True, name="tether-otel").start()
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
    without custody (the run starts pi as its child). A workdir holding the ledger, the config,
    the run directories or the workspaces, or a missing provider key, is refused first; the
    session's workspace is made here at its first run."""
    if not cfg.custody.detached:
        return None
    provider_keys(cfg, args.agent)  # a missing key refuses before the workspace is made
    workdir = run_workdir(
        cfg,
        args.agent,
        args.session,
        ledger_path=ledger_file(ledger_url),
        workdir=args.workdir,
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


def parse(
    argv: Sequence[str], *, config: str | None = None, ledger: str | None = None
) -> RunArgs | None:
    """``tether run``'s arguments read without the CLI, or None where they are not plain
    (help, an unknown or abbreviated option, an option's value that looks like an option, no
    request or several). Plain arguments are read exactly as the command reads them
    (``tests/test_cli_entry.py`` checks it against the command's own parsing), so that
    ``tether`` may run them without loading the CLI; anything else goes to the command, which
    says what is wrong. ``config`` and ``ledger`` are those given before ``run``
    (:func:`tether.cli.entry.split_globals`); the command's own win over them."""
    try:
        opts, rest = getopt.gnu_getopt(list(argv), SHORT_OPTIONS, list(LONG_OPTIONS))
    except getopt.GetoptError:
        return None
    if len(rest) != 1 or not _spelled_out(argv):
        return None
    given: dict[str, str] = {}
    for flag, value in opts:
        if value.startswith("-"):
            return None  # `-s --json`: the command may read that otherwise
        given[{"-s": "--session", "-a": "--agent", "-c": "--config"}.get(flag, flag)] = value
    if "--session" not in given or "--agent" not in given:
        return None
    config, workdir = given.get("--config", config), given.get("--workdir")
    return RunArgs(
        request=rest[0],
        session=given["--session"],
        agent=given["--agent"],
        actor=given.get("--actor", "user:local"),
        workdir=Path(workdir) if workdir is not None else None,
        config=Path(config) if config is not None else None,
        ledger=given.get("--ledger", ledger),
        as_json="--json" in given,
        wait="--no-wait" not in given,
    )


_SPELLED = frozenset(f"--{name.rstrip('=')}" for name in LONG_OPTIONS)


def _spelled_out(argv: Sequence[str]) -> bool:
    """No long option is abbreviated (getopt takes ``--sess`` for ``--session``; the command
    does not)."""
    for word in argv:
        if word == "--":
            return True
        if word.startswith("--") and word.split("=", 1)[0] not in _SPELLED:
            return False
    return True


def head_start(
    argv: Sequence[str], *, config: str | None = None, ledger: str | None = None
) -> Started | None:
    """The start of the run ``tether [--config C] [--ledger L] run ARGV`` asks for, made before
    the CLI is loaded; None when the arguments are not plain, the request is on stdin, or the
    start fails (the command then makes it again, and says what is wrong)."""
    args = parse(argv, config=config, ledger=ledger)
    if args is None or args.request == "-":
        return None
    try:
        return start(args)
    except Exception:
        return None
