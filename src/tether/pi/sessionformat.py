"""pi's session format (``docs/session-format.md``, version 3), both ways: what a session entry
stands for, and the entry that stands for it. The mirror (a run's file as pi writes it), the
import and the export all read and write entries through this one module, so the same pi entry
becomes the same row whichever way it comes in.

An entry is one of (:class:`EntryKind`):

    message              → the AgentMessage it stores
    custom_message       → the ``custom`` AgentMessage pi builds from it
    branch_summary       → the ``branchSummary`` AgentMessage (only with a summary: pi's context
                           has none for an empty one)
    compaction           → a compaction object (summary, covers_to, tokens_before, continuation …)
    custom "tether.receipt" → a receipt object (how a file carries a receipt, which pi has not)
    context_edit         → an edit of an earlier entry, nothing of its own
    anything else        → bookkeeping (model and thinking-level changes, labels, names, usage,
                           extension state): no message

The messages are the ones pi's own ``sessionEntryToContextMessages`` builds (the pinned
package's ``dist/core/session-manager.js`` and ``messages.js``), as JSON has them. Where the two
ways tether used to read entries differed, pi decides:

* a ``custom_message``'s ``display`` and ``details``, and a ``branch_summary``'s ``fromId``, are
  carried as the entry has them: pi copies ``entry.display``/``entry.fromId`` and JSON drops an
  undefined field, so a missing one stays missing (no ``display: false``, no ``fromId: null``
  that pi would not have);
* null content is read as pi reads it: ``[]`` for user, assistant and tool-result messages and
  for a ``custom_message``, ``""`` for a system message;
* a message of version 2's ``hookMessage`` role is ``custom``, as pi's migration makes it (pi
  migrates files before version 3; the ledger knows no ``hookMessage`` role);
* entry timestamps become Unix milliseconds exactly (pi: ``new Date(ts).getTime()``); one
  without an offset is read as UTC (pi always writes ``Z``).
"""

from __future__ import annotations

import contextlib
import enum
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = [
    "BODY_FIELDS",
    "RECEIPT_TYPE",
    "SESSION_VERSION",
    "EntryKind",
    "compaction_body",
    "compaction_entry",
    "entry_kind",
    "entry_message",
    "entry_time",
    "iso_of_ms",
    "message_entry",
    "message_text",
    "ms_of_iso",
    "new_entry_id",
    "receipt_body",
    "receipt_entry",
]

SESSION_VERSION = 3
RECEIPT_TYPE = "tether.receipt"
"""The ``customType`` of the ``custom`` entry that carries a receipt in a pi file."""


class EntryKind(enum.StrEnum):
    """What a pi session entry stands for."""

    MESSAGE = "message"
    COMPACTION = "compaction"
    RECEIPT = "receipt"
    EDIT = "edit"
    """A ``context_edit``: it changes an earlier entry's message, and has none of its own."""
    BOOKKEEPING = "bookkeeping"


# The entry fields a row (its body, entry id and seq) holds, per entry type; an import keeps
# the rest beside the row. ``parentId`` is rebuilt on export from the order of the rows.
_BASE = frozenset({"type", "id", "parentId"})
BODY_FIELDS: dict[str, frozenset[str]] = {
    "message": _BASE | {"message"},
    "custom_message": _BASE | {"customType", "content", "display", "details"},
    "branch_summary": _BASE | {"summary", "fromId"},
    "compaction": _BASE
    | {"summary", "firstKeptEntryId", "firstKeptEntryIndex", "tokensBefore", "details", "fromHook"},
    "custom": _BASE | {"customType", "data"},
}

_NULL_CONTENT = {"system": "", "user": [], "assistant": [], "toolResult": []}
"""pi's reading of a message with null or missing content, by role."""


def entry_kind(entry: dict[str, Any]) -> EntryKind:
    kind = entry.get("type")
    if kind in ("message", "custom_message"):
        return EntryKind.MESSAGE
    if kind == "branch_summary":
        # pi's context has no message for a branch summary without a summary
        return EntryKind.MESSAGE if entry.get("summary") else EntryKind.BOOKKEEPING
    if kind == "compaction":
        return EntryKind.COMPACTION
    if kind == "custom" and entry.get("customType") == RECEIPT_TYPE:
        return EntryKind.RECEIPT
    if kind == "context_edit":
        return EntryKind.EDIT
    return EntryKind.BOOKKEEPING


def entry_message(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The AgentMessage a message entry stands for, as pi's context has it; None for every
    other kind, and for a ``message`` entry that holds no message with a role."""
    if entry_kind(entry) is not EntryKind.MESSAGE:
        return None
    kind = entry.get("type")
    if kind == "message":
        message = entry.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return None
        message = dict(message)
        if message["role"] == "hookMessage":
            message["role"] = "custom"
        if message.get("content") is None and message["role"] in _NULL_CONTENT:
            message["content"] = _NULL_CONTENT[message["role"]]
        return message
    if kind == "custom_message":
        content = entry.get("content")
        out: dict[str, Any] = {
            "role": "custom",
            "customType": entry.get("customType"),
            "content": content if content is not None else [],
        }
        for key in ("display", "details"):
            if key in entry:
                out[key] = entry[key]
        out["timestamp"] = ms_of_iso(entry.get("timestamp"))
        return out
    # branch_summary
    out = {"role": "branchSummary", "summary": entry.get("summary")}
    if "fromId" in entry:
        out["fromId"] = entry["fromId"]
    out["timestamp"] = ms_of_iso(entry.get("timestamp"))
    return out


def message_entry(message: dict[str, Any], timestamp: Any) -> dict[str, Any]:
    """The entry fields (``type`` and what follows; no id, parent or timestamp) that stand for
    ``message`` in an entry written at ``timestamp``: a ``custom_message`` or ``branch_summary``
    when pi would build exactly this message from it, else a ``message`` entry holding it."""
    role = message.get("role")
    out: dict[str, Any]
    if role == "custom":
        out = {
            "type": "custom_message",
            "customType": message.get("customType"),
            "content": message.get("content", []),
        }
        for key in ("display", "details"):
            if key in message:
                out[key] = message[key]
    elif role == "branchSummary":
        out = {"type": "branch_summary", "summary": message.get("summary", "")}
        if "fromId" in message:
            out["fromId"] = message["fromId"]
    else:
        return {"type": "message", "message": message}
    # pi would build a different message from that entry (its timestamp comes from the entry's,
    # a field the entry has no place for): a message entry holds this one exactly
    if entry_message({**out, "timestamp": timestamp}) != message:
        return {"type": "message", "message": message}
    return out


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


def compaction_body(entry: dict[str, Any], covers_to: int) -> dict[str, Any]:
    """The compaction object for a pi ``compaction`` entry
    (docs/contracts.md#the-interchange-format, docs/contracts.md#compaction-rows).

    ``continuation`` is the typed marker a tether continuation checkpoint carries in the entry's
    ``details`` (absent for a compaction pi made on its own)."""
    details = entry.get("details")
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


def compaction_entry(body: dict[str, Any], first_kept: str) -> dict[str, Any]:
    """The entry fields of a compaction object (the inverse of :func:`compaction_body`) that
    keeps from ``first_kept`` (its own id: it keeps nothing before it)."""
    out: dict[str, Any] = {
        "type": "compaction",
        "summary": body.get("summary", ""),
        "firstKeptEntryId": first_kept,
        "tokensBefore": body.get("tokens_before") or 0,
    }
    details = body.get("details")
    marker = body.get("continuation")
    if isinstance(marker, dict):
        # read back from the details, as compaction_body reads it
        details = {**(details if isinstance(details, dict) else {}), "continuation": marker}
    if details is not None or "details" in body:
        out["details"] = details
    if "from_hook" in body:
        out["fromHook"] = body["from_hook"]
    return out


def receipt_body(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The receipt object a ``tether.receipt`` entry carries; None when it has no kind."""
    data = entry.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    return data


def receipt_entry(body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "custom", "customType": RECEIPT_TYPE, "data": body}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_of_iso(stamp: Any) -> int | None:
    """An ISO timestamp as Unix milliseconds (what pi's ``new Date(ts).getTime()`` gives), None
    when it is not one (pi would get NaN, which JSON writes as null)."""
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(milliseconds=1)


def entry_time(entry: dict[str, Any]) -> float | None:
    """An entry's ISO timestamp as wall-clock seconds."""
    ms = ms_of_iso(entry.get("timestamp"))
    return ms / 1000 if ms is not None else None


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


def new_entry_id(taken: set[str]) -> str:
    """An 8-hex id like pi's own, unique in ``taken`` (and added to it)."""
    while True:
        eid = uuid.uuid4().hex[:8]
        if eid not in taken:
            taken.add(eid)
            return eid
