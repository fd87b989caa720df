"""Writing a run's pi session file (``docs/session-format.md``, version 3) before pi starts.

For a follow-up, the file holds the follow-up view's messages as ``message`` entries in view
order, one parent chain, so pi's context is exactly the view: pi appends the new request and
everything after it. The entry ids written here are tether's, so the mirror knows which entries
it must not mirror again.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["SESSION_VERSION", "PreEntry", "iso_of_ms", "new_entry_id", "write_session_file"]

SESSION_VERSION = 3


def new_entry_id(taken: set[str]) -> str:
    """An 8-hex id like pi's own, unique in ``taken`` (and added to it)."""
    while True:
        eid = uuid.uuid4().hex[:8]
        if eid not in taken:
            taken.add(eid)
            return eid


def iso_of_ms(ms: Any) -> str:
    """Unix milliseconds as pi writes entry timestamps (``Date.toISOString``); now when absent
    or out of any date's range."""
    when = datetime.now(UTC)
    if isinstance(ms, int | float) and not isinstance(ms, bool):
        # a timestamp no date can hold (NaN, 1e23 from a row written before loads checked
        # them) is the entry's time of writing instead: a date pi can parse
        with contextlib.suppress(ValueError, OverflowError, OSError):
            when = datetime.fromtimestamp(ms / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class PreEntry:
    """One message to pre-write, and the ledger row it stands for (None: synthetic)."""

    message: dict[str, Any]
    seq: int | None


def write_session_file(
    path: Path, *, session_id: str, cwd: Path, messages: Sequence[PreEntry]
) -> tuple[int, dict[str, int | None]]:
    """Write the file; return its size (where pi's own entries will start) and the entry id of
    each pre-written message mapped to its ledger seq."""
    header = {
        "type": "session",
        "version": SESSION_VERSION,
        "id": session_id,
        "timestamp": iso_of_ms(None),
        "cwd": str(cwd.resolve()),
    }
    lines = [json.dumps(header, ensure_ascii=False)]
    ids: dict[str, int | None] = {}
    taken: set[str] = set()
    parent: str | None = None
    for pre in messages:
        eid = new_entry_id(taken)
        lines.append(
            json.dumps(
                {
                    "type": "message",
                    "id": eid,
                    "parentId": parent,
                    "timestamp": iso_of_ms(pre.message.get("timestamp")),
                    "message": pre.message,
                },
                ensure_ascii=False,
            )
        )
        ids[eid] = pre.seq
        parent = eid
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(data)
    return len(data), ids
