"""The ``tether`` program run as a user runs it: a subprocess of this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Literal, overload

__all__ = ["TETHER", "one_line_error", "run_args", "tether"]

TETHER = [sys.executable, "-m", "tether"]


@overload
def tether(
    *args: str | bytes,
    cwd: Path | None = ...,
    env: dict[str, str | None] | None = ...,
    stdin: str | None = ...,
    timeout: float = ...,
    umask: int | None = ...,
    binary: Literal[False] = ...,
) -> subprocess.CompletedProcess[str]: ...


@overload
def tether(
    *args: str | bytes,
    cwd: Path | None = ...,
    env: dict[str, str | None] | None = ...,
    stdin: bytes | None = ...,
    timeout: float = ...,
    umask: int | None = ...,
    binary: Literal[True],
) -> subprocess.CompletedProcess[bytes]: ...


def tether(
    *args: str | bytes,
    cwd: Path | None = None,
    env: dict[str, str | None] | None = None,
    stdin: str | bytes | None = None,
    timeout: float = 120,
    umask: int | None = None,
    binary: bool = False,
) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    """``tether ARGS`` in ``cwd``, its output captured (text unless ``binary``); ``env`` is added
    to this process's environment (80 columns, so that rich wraps the same everywhere; a None
    value removes a variable), ``umask`` set for it alone."""
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
        env={
            k: v for k, v in {**os.environ, "COLUMNS": "80", **(env or {})}.items() if v is not None
        },
    )


def run_args(
    config: Path, *rest: str, session: str = "s1", agent: str = "rev", as_json: bool = False
) -> list[str]:
    """``run --config CONFIG -s SESSION -a AGENT [--json] REST…``: a ``tether run`` command line."""
    return [
        "run",
        "--config",
        str(config),
        "-s",
        session,
        "-a",
        agent,
        *(["--json"] if as_json else []),
        *rest,
    ]


def one_line_error(
    result: subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes],
) -> str:
    """The one line a failed command says on stderr (no traceback, no second line)."""
    err = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err
