"""pi session entries (``docs/session-format.md``) as ledger rows.

Conversation entries become rows; pi's bookkeeping does not (model and thinking-level changes,
labels, session names, usage records, extension state and context edits change no message):

    message         → a MESSAGE row holding the AgentMessage as pi stored it
    custom_message  → a MESSAGE row holding the ``custom`` AgentMessage pi builds from it
    branch_summary  → a MESSAGE row holding the ``branchSummary`` AgentMessage
    compaction      → a COMPACTION row (summary, covers_to, tokens_before, continuation marker)

Actors: the requester (``user:…``) for user and bash-command messages, ``tool:NAME`` for tool
results, ``agent:NAME`` for everything the agent's side wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from tether.ledger import NewRow, RowKind

__all__ = [
    "CONVERSATION_ENTRIES",
    "Actors",
    "anchors_with_seqs",
    "compaction_body",
    "entry_message",
    "entry_time",
    "message_actor",
    "message_row",
    "message_text",
]

CONVERSATION_ENTRIES = frozenset({"message", "custom_message", "branch_summary", "compaction"})


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


def entry_time(entry: dict[str, Any]) -> float | None:
    """An entry's ISO timestamp as wall-clock seconds."""
    stamp = entry.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _ms(entry: dict[str, Any]) -> int | None:
    when = entry_time(entry)
    return int(when * 1000) if when is not None else None


def entry_message(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The AgentMessage a conversation entry stands for (None for compactions and bookkeeping)."""
    kind = entry.get("type")
    if kind == "message":
        message = entry.get("message")
        return message if isinstance(message, dict) else None
    if kind == "custom_message":
        out: dict[str, Any] = {
            "role": "custom",
            "customType": entry.get("customType"),
            "content": entry.get("content", []),
            "display": entry.get("display", False),
            "timestamp": _ms(entry),
        }
        if "details" in entry:
            out["details"] = entry["details"]
        return out
    if kind == "branch_summary":
        return {
            "role": "branchSummary",
            "summary": entry.get("summary", ""),
            "fromId": entry.get("fromId"),
            "timestamp": _ms(entry),
        }
    return None


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


def message_text(message: dict[str, Any]) -> str:
    """The text blocks of a message, joined (thinking and tool calls left out)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def anchors_with_seqs(
    anchors: Any, seq_of: Callable[[str], int | None], covers_to: int
) -> dict[str, Any] | None:
    """A checkpoint's anchors (``details.anchors``, written by the extension) with each one's
    pi entry id replaced by the ledger seq of that entry's row (DESIGN §3.13). An anchor whose
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


def compaction_body(
    entry: dict[str, Any], covers_to: int, seq_of: Callable[[str], int | None] | None = None
) -> dict[str, Any]:
    """The COMPACTION row body for a pi ``compaction`` entry (DESIGN §3.1, §3.6).

    ``continuation`` is the typed marker a tether continuation checkpoint carries in the entry's
    ``details`` (absent for a compaction pi made on its own). ``seq_of`` maps pi entry ids to
    ledger seqs: with it, the anchors in ``details`` name their rows by seq."""
    details = entry.get("details")
    if isinstance(details, dict) and "anchors" in details:
        details = {
            **details,
            "anchors": anchors_with_seqs(details["anchors"], seq_of or (lambda _: None), covers_to),
        }
    body: dict[str, Any] = {
        "summary": entry.get("summary", ""),
        "covers_to": covers_to,
        "tokens_before": entry.get("tokensBefore"),
        "first_kept_entry_id": entry.get("firstKeptEntryId"),
        "self_retaining": entry.get("firstKeptEntryId") == entry.get("id"),
    }
    if isinstance(details, dict):
        body["details"] = details
        marker = details.get("continuation")
        if isinstance(marker, dict):
            body["continuation"] = marker
    if entry.get("fromHook") is not None:
        body["from_hook"] = bool(entry.get("fromHook"))
    return body


def message_row(entry: dict[str, Any], actors: Actors) -> NewRow | None:
    message = entry_message(entry)
    if message is None:
        return None
    return NewRow(
        actor=message_actor(message, actors),
        kind=RowKind.MESSAGE,
        body=message,
        entry_id=str(entry["id"]),
    )
