"""``prompt.sent`` and ``compact.sent``: written into the run directory before either command
reaches pi's FIFO, so that a harness taking the run over knows whether pi was prompted (it then
follows the same run, never prompting again) and whether the summary command may have been
delivered (it is then never sent again: invariant 16).

    transport = KeeperTransport.adopt(..., before_send=Markers(run_dir).mark)
    if Markers(run_dir).sent(Marked.PROMPT): ...
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import time
from pathlib import Path
from typing import Any

from tether.files import open_own

__all__ = ["Marked", "Markers"]


class Marked(enum.StrEnum):
    """The commands a marker is written for (pi's RPC command types)."""

    PROMPT = "prompt"
    COMPACT = "compact"


class Markers:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def path(self, kind: Marked) -> Path:
        return self.run_dir / f"{kind.value}.sent"

    def mark(self, data: bytes) -> None:
        """Record, before ``data`` is written to pi, each prompt or compact command in it."""
        for line in data.split(b"\n"):
            if b'"compact"' not in line and b'"prompt"' not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                kind = record.get("type") if isinstance(record, dict) else None
                if kind in tuple(Marked):
                    self._write(Marked(kind), {"id": record.get("id"), "at": time.time()})

    def sent(self, kind: Marked) -> bool:
        """Whether the marker tether wrote is there (not a file in its place: a link, …)."""
        try:
            with open_own(self.path(kind)):
                return True
        except OSError:
            return False

    def sent_id(self, kind: Marked) -> object:
        """The request id of the marked command (None when unreadable)."""
        try:
            with open_own(self.path(kind)) as f:
                found = json.loads(f.read())
        except (OSError, ValueError):
            return None
        return found.get("id") if isinstance(found, dict) else None

    def _write(self, kind: Marked, data: dict[str, Any]) -> None:
        # Written before the command and not synced: it must survive this process (a SIGKILL
        # leaves the page cache to the next harness), not the host, which pi would not survive.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        fd = os.open(self.path(kind), flags, 0o600)
        try:
            os.write(fd, json.dumps(data).encode())
        finally:
            os.close(fd)
