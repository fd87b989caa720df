"""The ``tether`` program run as a user runs it: a subprocess of this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["TETHER", "context_args", "one_line_error", "run_args", "start_tether", "tether"]

TETHER = [sys.executable, "-m", "tether"]


def _env(env: dict[str, str | None] | None) -> dict[str, str]:
    """This process's environment with ``env`` applied (a None value removes a variable), at 80
    columns so that rich wraps the same everywhere."""
    merged = {**os.environ, "COLUMNS": "80", **(env or {})}
    return {k: v for k, v in merged.items() if v is not None}


def tether(
    *args: str | bytes,
    cwd: Path | None = None,
    env: dict[str, str | None] | None = None,
    stdin: str | bytes | None = None,
    timeout: float = 120,
    umask: int | None = None,
    binary: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """``tether ARGS`` in ``cwd`` with ``env`` (:func:`_env`) and, when given, ``umask``; its
    output captured, as text unless ``binary``."""
    argv: list[str | bytes] = [*TETHER, *args]
    if umask is not None:
        argv = ["sh", "-c", f'umask {umask:03o}; exec "$@"', "sh", *argv]
    return subprocess.run(
        argv,
        capture_output=True,
        text=not binary,
        input=stdin,
        cwd=cwd,
        timeout=timeout,
        env=_env(env),
    )


def start_tether(
    *args: str, cwd: Path | None = None, env: dict[str, str | None] | None = None
) -> subprocess.Popen[str]:
    """``tether ARGS`` started and left running, its stdout and stderr piped (text)."""
    return subprocess.Popen(
        [*TETHER, *args],
        cwd=cwd,
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _command_args(
    command: str, config: Path, rest: tuple[str, ...], session: str, agent: str, as_json: bool
) -> list[str]:
    options = ["--config", str(config), "-s", session, "-a", agent]
    return [command, *options, *(["--json"] if as_json else []), *rest]


def run_args(
    config: Path, *rest: str, session: str = "s1", agent: str = "rev", as_json: bool = False
) -> list[str]:
    """``run --config CONFIG -s SESSION -a AGENT [--json] REST…``: a ``tether run`` command line."""
    return _command_args("run", config, rest, session, agent, as_json)


def context_args(
    config: Path, *rest: str, session: str = "s1", agent: str = "rev", as_json: bool = False
) -> list[str]:
    """``context --config CONFIG -s SESSION -a AGENT [--json] REST…``."""
    return _command_args("context", config, rest, session, agent, as_json)


def one_line_error(result: subprocess.CompletedProcess[Any]) -> str:
    """The one line a failed command says on stderr (no traceback, no second line)."""
    err = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err
