"""The searchable text of a row: what recall's full-text index reads (SQLite FTS5 external content,
PostgreSQL ``to_tsvector``), derived once at append so the log is never copied again."""

from __future__ import annotations

import json
from typing import Any

from tether.ledger.models import RowKind

__all__ = ["row_text"]

# One encoder, made once: json.dumps with keyword arguments builds a new encoder on every call.
_ARGS = json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode


def _blocks_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                out.append(block["text"])
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                out.append(block["thinking"])
            elif kind == "toolCall":
                args = _ARGS(block.get("arguments"))
                out.append(f"{block.get('name', '')} {args}")
    return out


def row_text(kind: RowKind, body: dict[str, Any]) -> str:
    # NUL never helps a search, and a PostgreSQL text column cannot hold it (the body keeps it,
    # escaped as \u0000 in its JSON).
    return _text(kind, body).replace("\x00", "")


def _text(kind: RowKind, body: dict[str, Any]) -> str:
    if kind is RowKind.MESSAGE:
        parts = _blocks_text(body.get("content"))
        if body.get("role") == "bashExecution":
            parts = [str(body.get("command", "")), str(body.get("output", ""))]
        return "\n".join(parts)
    if kind is RowKind.COMPACTION:
        summary = body.get("summary")
        return summary if isinstance(summary, str) else ""
    return ""
