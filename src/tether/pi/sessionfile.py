"""Writing a run's pi session file (``docs/session-format.md``, version 3) before pi starts.

For a follow-up, the file holds the follow-up view's messages as ``message`` entries in view
order, one parent chain, so pi's context is exactly the view: pi appends the new request and
everything after it (the format: :mod:`tether.pi.sessionformat`). The entry ids
written here are tether's, so the mirror knows which entries it must not mirror again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from tether.pi.sessionformat import SESSION_VERSION, iso_of_ms, new_entry_id

__all__ = ["SESSION_LINK", "PreEntry", "write_session_file"]

SESSION_LINK = "pi-session/session.jsonl"
"""Where a sandboxed run's ``RUN_DIR/session.jsonl`` links to (``tether.pi.launch.pi_command``
makes the link): the one link tether takes there, by this target, never by following it."""


class PreEntry(msgspec.Struct, frozen=True):
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
