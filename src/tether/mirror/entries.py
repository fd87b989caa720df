"""pi session entries as ledger rows: pi's format (:mod:`tether.pi.sessionformat`, shared with
the import and the export) plus who wrote each row.

    message entries → a MESSAGE row holding the AgentMessage pi's context has for the entry
    compaction      → a COMPACTION row (summary, covers_to, tokens_before, continuation marker)
    tether.receipt  → a RECEIPT row
    anything else   → no row (pi's bookkeeping and context edits change no message)

Actors: the requester (``user:…``) for user and bash-command messages, ``tool:NAME`` for tool
results, ``agent:NAME`` for everything the agent's side wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from tether.ledger import NewRow, RowKind
from tether.pi.sessionformat import (
    EntryKind,
    compaction_body,
    entry_kind,
    entry_message,
    entry_time,
    message_text,
    receipt_body,
)

__all__ = [
    "ROW_KINDS",
    "Actors",
    "anchors_with_seqs",
    "compaction_body",
    "entry_message",
    "entry_row",
    "entry_time",
    "message_actor",
    "message_text",
]

ROW_KINDS = {
    EntryKind.MESSAGE: RowKind.MESSAGE,
    EntryKind.COMPACTION: RowKind.COMPACTION,
    EntryKind.RECEIPT: RowKind.RECEIPT,
}
"""The kind of row each kind of entry becomes; the other kinds become none."""


class Actors(msgspec.Struct, frozen=True):
    user: str
    """The requester, e.g. ``user:ana``."""
    agent: str
    """The agent's name (rows carry ``agent:NAME``)."""
    relayed: dict[str, str] = msgspec.field(default_factory=dict)
    """Text of a request relayed into the live run (``steer``/``follow_up``) -> its sender: the
    user message pi writes for it carries the sender, not the run's requester."""

    @property
    def agent_actor(self) -> str:
        return f"agent:{self.agent}"


def message_actor(message: dict[str, Any], actors: Actors) -> str:
    role = message.get("role")
    if role == "toolResult":
        return f"tool:{message.get('toolName') or 'unknown'}"
    if role == "user" and actors.relayed:
        sender = actors.relayed.get(message_text(message))
        if sender is not None:
            return sender
    if role in ("user", "bashExecution"):
        return actors.user
    return actors.agent_actor


def anchors_with_seqs(
    anchors: Any, seq_of: Callable[[str], int | None], covers_to: int
) -> dict[str, Any] | None:
    """A checkpoint's anchors (``details.anchors``, written by the extension) with each one's
    pi entry id replaced by the ledger seq of that entry's row
    (docs/cli.md#tether-eval-continuation). An anchor whose
    entry has no row (a notice tether wrote itself), or whose row the checkpoint does not cover,
    is dropped: every anchor names a covered row."""
    if not isinstance(anchors, dict) or not isinstance(anchors.get("items"), list):
        return None
    items: list[dict[str, Any]] = []
    dropped = 0
    for item in anchors["items"]:
        if not isinstance(item, dict):
            continue
        entry = item.get("entry")
        seq = seq_of(entry) if isinstance(entry, str) else item.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq <= covers_to:
            dropped += 1
            continue
        out = {k: v for k, v in item.items() if k != "entry"}
        out["seq"] = seq
        items.append(out)
    return {**anchors, "items": items, "unmapped": dropped}


def entry_row(
    entry: dict[str, Any],
    actors: Actors,
    *,
    covers_to: int = 0,
    seq_of: Callable[[str], int | None] | None = None,
) -> NewRow | None:
    """The row ``entry`` becomes (``covers_to`` for a compaction: the last seq it covers), or
    None: bookkeeping, an edit, a message entry without a message, a receipt without a kind.
    ``seq_of`` maps pi entry ids to ledger seqs: with it, a checkpoint's anchors name their rows
    by seq (without it, only anchors that already carry a covered seq are kept)."""
    kind = entry_kind(entry)
    eid = str(entry["id"]) if entry.get("id") is not None else None
    body: dict[str, Any] | None
    if kind is EntryKind.MESSAGE:
        body = entry_message(entry)
        actor = message_actor(body, actors) if body is not None else ""
    elif kind is EntryKind.COMPACTION:
        body, actor = compaction_body(entry, covers_to), actors.agent_actor
        details = body.get("details")
        if isinstance(details, dict) and "anchors" in details:
            anchors = anchors_with_seqs(details["anchors"], seq_of or (lambda _: None), covers_to)
            body["details"] = {**details, "anchors": anchors}
    elif kind is EntryKind.RECEIPT:
        body, actor = receipt_body(entry), actors.agent_actor
    else:
        return None
    if body is None:
        return None
    return NewRow(actor=actor, kind=ROW_KINDS[kind], body=body, entry_id=eid)
