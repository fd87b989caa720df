"""A row, or a pi message, as the templates show it: display parts (text, thinking, tool call,
image, other), images as data: URLs only for image types."""

from __future__ import annotations

import json
from typing import Any

from tether.followup.messages import anchor_items
from tether.ledger import Row, RowKind
from tether.service.api import row_json
from tether.service.auth import Caller

__all__ = ["THUMBNAIL_TYPES", "message_display", "row_display"]

THUMBNAIL_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def _args_text(args: Any) -> str:
    """Tool-call arguments as JSON: one line when short, indented when long."""
    flat = json.dumps(args, ensure_ascii=False)
    return flat if len(flat) <= 100 else json.dumps(args, ensure_ascii=False, indent=1)


def _parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as display parts: text, thinking, tool_call, image, other."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return [] if content is None else [{"type": "other", "json": content}]
    out: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            out.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "thinking":
            out.append({"type": "thinking", "text": str(block.get("thinking", ""))})
        elif kind == "toolCall":
            args = block.get("arguments")
            out.append(
                {
                    "type": "tool_call",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": args if isinstance(args, str) else _args_text(args),
                }
            )
        elif kind == "image":
            data = block.get("data")
            mime = str(block.get("mimeType") or "image/png")
            # Only image types become data: URLs (never text/html or SVG with its scripts).
            shown = isinstance(data, str) and mime in THUMBNAIL_TYPES
            out.append(
                {
                    "type": "image",
                    "mime": mime,
                    "data": data if shown else None,
                    "size": len(data) if isinstance(data, str) else 0,
                }
            )
        else:
            out.append({"type": "other", "json": block})
    return out


def message_display(message: dict[str, Any]) -> dict[str, Any]:
    """A pi AgentMessage as the templates show it."""
    role = message.get("role")
    shown: dict[str, Any] = {"role": role, "parts": _parts(message.get("content"))}
    if role == "toolResult":
        shown["tool"] = {
            "name": message.get("toolName"),
            "call_id": message.get("toolCallId"),
            "is_error": bool(message.get("isError")),
        }
    elif role == "bashExecution":
        shown["parts"] = [
            {"type": "tool_call", "id": None, "name": "bash", "arguments": message.get("command")},
            {"type": "text", "text": str(message.get("output", ""))},
        ]
        shown["tool"] = {"name": "bash", "call_id": None, "is_error": message.get("exitCode") != 0}
    elif role == "custom":
        shown["custom_type"] = message.get("customType")
    elif role == "assistant":
        shown["stop_reason"] = message.get("stopReason")
    elif role == "system":
        # pi's opening system message: its prompt sections and tools, collapsed.
        rest = {k: v for k, v in message.items() if k not in ("role", "timestamp", "content")}
        shown["parts"] = [p for p in shown["parts"] if p.get("text", True)]
        if rest:
            shown["parts"].append({"type": "other", "json": {"type": "system prompt", **rest}})
    return shown


def row_display(row: Row, who: Caller) -> dict[str, Any]:
    """A row for the timeline: withheld rows carry only their seq (as the API names them)."""
    if row_json(row, who).get("withheld"):
        return {"seq": row.seq, "kind": "withheld"}
    out: dict[str, Any] = {
        "seq": row.seq,
        "run": row.run,
        "actor": row.actor,
        "kind": row.kind.value,
        "bytes": row.bytes,
        "media_bytes": row.media_bytes,
        "sources": list(row.sources),
    }
    origin = row.extra.get("origin")
    if isinstance(origin, int) and not isinstance(origin, bool):
        # A follow-up view's copy of an earlier row (the previous request): not someone
        # asking again.
        out["copy_of"] = origin
    if row.kind is RowKind.MESSAGE:
        out["message"] = message_display(row.body)
    elif row.kind is RowKind.COMPACTION:
        body = row.body
        out["compaction"] = {
            "kind": "continuation" if body.get("continuation") else "pi",
            "covers_to": row.covers_to,
            "summary": str(body.get("summary", "")),
            "tokens_before": body.get("tokens_before"),
            # What the checkpoint keeps verbatim beside its summary (commands, paths, errors…),
            # each naming its row; the row's own sources cover them (it carries all it covers).
            "anchors": anchor_items(body),
        }
    else:
        out["receipt"] = {
            "kind": row.body.get("kind"),
            "reason": row.body.get("reason"),
            "run": row.body.get("run"),
        }
    return out
