"""The ``tether`` program: the CLI (:mod:`tether.cli.app`) with a head start and a quick exit.

- ``tether run`` with plain arguments starts its pi first thing
  (:func:`tether.cli.run_start.head_start`) and runs without loading the CLI (typer, click,
  rich): pi's start, the largest fixed cost of a run, overlaps the import of the harness, and
  the CPU the CLI would take is left to pi on a busy machine. Other arguments, and a start that
  fails, go to the CLI's ``run`` command, which says what is wrong.
- When the command is done, the process exits without the interpreter's teardown
  (:func:`exit_now`).

Only the program does this: :func:`tether.cli.app.main` stays the plain CLI for callers that
embed it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

__all__ = ["exit_now", "main"]


def main() -> NoReturn:
    if sys.argv[1:2] == ["run"]:
        from tether.cli.run_start import head_start

        started = head_start(sys.argv[2:])
        if started is not None:
            try:
                from tether.cli.run_live import run_started

                run_started(started)
            except SystemExit as exc:
                exit_now(exc.code)
            except BaseException:
                started.abandon()  # pi still at its gate, if the run never took it
                raise
            exit_now(0)
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
