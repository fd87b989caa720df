"""The ``tether`` program: the CLI (:mod:`tether.cli.app`) with a head start and a quick exit.

- ``tether run`` with plain arguments (``--config``/``--ledger`` before ``run`` included)
  starts its pi first thing (:func:`tether.cli.run_start.head_start`) and runs without
  loading the CLI (typer, click, rich): pi's start, the largest fixed cost of a run, overlaps
  the import of the harness, and the CPU the CLI would take is left to pi on a busy machine.
  Other arguments, and a start that fails, go to the CLI's ``run`` command, which says what is
  wrong.
- While ``tether run`` loads its modules, the garbage collector waits; what they made is then
  frozen out of every later collection (:func:`loading`).
- When the command is done, the process exits without the interpreter's teardown
  (:func:`exit_now`).

Only the program does this: :func:`tether.cli.app.main` stays the plain CLI for callers that
embed it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import getopt
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import NoReturn

__all__ = ["exit_now", "loading", "main", "split_globals"]


# The options of `tether` itself, given before the command (tests check them against the CLI's).
GLOBAL_SHORT_OPTIONS = "c:"
GLOBAL_LONG_OPTIONS = ("config=", "ledger=")


def split_globals(argv: Sequence[str]) -> tuple[dict[str, str], list[str]] | None:
    """The options given before the command (``--config``/``-c``, ``--ledger``), by long name,
    and the words from the command on; None where they are not plain (another option, an
    abbreviation, ``--``, a value that looks like an option): the CLI reads those."""
    try:
        opts, rest = getopt.getopt(list(argv), GLOBAL_SHORT_OPTIONS, list(GLOBAL_LONG_OPTIONS))
    except getopt.GetoptError:
        return None
    spelled = {f"--{name.rstrip('=')}" for name in GLOBAL_LONG_OPTIONS}
    for word in argv[: len(argv) - len(rest)]:
        if word == "--" or (word.startswith("--") and word.split("=", 1)[0] not in spelled):
            return None
    given: dict[str, str] = {}
    for flag, value in opts:
        if value.startswith("-"):
            return None
        given["--config" if flag == "-c" else flag] = value
    return given, rest


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """No garbage collection while modules load; then what exists is frozen (``gc.freeze``:
    left out of every later collection) and collection resumes.

    The objects a module makes (functions, classes, constants) live as long as the process,
    yet each allocation counts towards the next collection: loading ``tether run``'s modules
    set off about 50 collections that went through them again and again (a 20-turn run
    collected for 13–23 ms of CPU, 2–5 ms without them). Frozen, they are never gone through
    again, and a run's collections go through the objects it made itself. Whatever loading
    left as garbage (little: modules make few cycles) stays, once."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def main() -> NoReturn:
    split = split_globals(sys.argv[1:])
    if split is not None and split[1][:1] == ["run"]:
        given, words = split
        with loading():
            from tether.cli.run_start import head_start

            started = head_start(
                words[1:], config=given.get("--config"), ledger=given.get("--ledger")
            )
            if started is not None:
                try:
                    from tether.cli.run_live import run_started
                except BaseException:
                    started.abandon()  # pi still at its gate: the run never took it
                    raise
        if started is not None:
            try:
                run_started(started)
            except SystemExit as exc:
                exit_now(exc.code)
            except BaseException:
                started.abandon()  # pi still at its gate, if the run never took it
                raise
            exit_now(0)
    with loading():
        from tether.cli.app import main as cli

    try:
        cli()
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(0)


def exit_now(code: object) -> NoReturn:
    """Exit with ``code`` (as ``SystemExit`` reads it), skipping the interpreter's teardown.

    By the time a command returns, what it wrote is committed and its files are closed; what the
    interpreter would still do is free every object of a few hundred modules one by one, 40 to
    70 ms at the end of each ``tether run`` (``bench/harness.py``). Exit handlers still run and
    the standard streams are flushed. A command that left threads running, or streams that cannot
    be flushed, exit the ordinary way, so that nothing is cut short or goes unreported.
    """
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if any(not t.daemon for t in others):
        raise SystemExit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(code) from None
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        # SystemExit("message"): the message on stderr, status 1.
        with contextlib.suppress(OSError, ValueError):
            print(code, file=sys.stderr, flush=True)
        status = 1
    os._exit(status & 0xFF)
