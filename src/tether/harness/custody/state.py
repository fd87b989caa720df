"""What a harness taking a run over needs (docs/architecture.md#custody): the mirror's start, the
request row,
the deadline, the view, the sources and the tools channel. Written by the driver, before pi is
let through, as ``RUN_DIR/custody.json`` (atomically, 0600); read by a resume and by a
``harness_lost`` reconcile.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from tether.files import open_own

__all__ = ["RUN_STATE", "CustodyState", "has_run_state", "load_run_state", "save_run_state"]

RUN_STATE = "custody.json"


class CustodyState(msgspec.Struct, kw_only=True):
    request_seq: int
    """The ledger seq of the run's request row."""
    offset: int = 0
    """Where pi's own entries begin in the session file (after the view's)."""
    known: dict[str, int | None] = {}
    """The session file's entry ids written from the view, with the seq each stands for."""
    deadline_at: float = 0.0
    """The run's deadline, wall-clock seconds (a resume counts what is left of it)."""
    view: dict[str, Any] | None = None
    """The run record's ``view`` (None for a session's first run)."""
    sources: list[str] = []
    """The obligations of everything the run was given."""
    tools_token: str | None = None
    tools_path: str | None = None
    """pi's tools socket and token: a resume serves the same ones."""
    sandboxed: bool = False
    """pi ran in the sandbox: what it wrote is read for the limits its tools hit."""
    nonce: str | None = None
    """The run's continuation nonce (``tether.pi.continuation``): a takeover checks the
    checkpoint's proof with it."""
    session_file: tuple[int, int] | None = None
    """The session file tether wrote (``st_dev``, ``st_ino``): the only file the mirror reads."""


def save_run_state(run_dir: Path, state: CustodyState) -> None:
    tmp = run_dir / (RUN_STATE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(state))
    os.replace(tmp, run_dir / RUN_STATE)


def load_run_state(run_dir: Path) -> CustodyState:
    """Raises ``OSError`` (no file, or ``ForeignFile``: not the one tether wrote, never read)
    or ``ValueError`` (not a run state)."""
    with open_own(run_dir / RUN_STATE) as f:
        data = f.read()
    try:
        return msgspec.json.decode(data, type=CustodyState)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{run_dir / RUN_STATE} is not a run's custody state: {exc}") from exc


def has_run_state(run_dir: Path) -> bool:
    return (run_dir / RUN_STATE).exists()
