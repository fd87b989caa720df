"""Lines of tether's session file (``tether ledger load``/``dump``) for a test: a session
``s1`` with one finished run ``r1`` of agent ``rev``, and its rows."""

from __future__ import annotations

from typing import Any

__all__ = ["one_run_head", "row_line"]


def one_run_head(*, started: str | None = None, ended: str | None = None) -> list[dict[str, Any]]:
    """The session line and the line of its one run, whose request is row 1."""
    return [
        {"type": "session", "id": "s1", "created": "2026-11-29T10:00:00Z"},
        {
            "type": "run",
            "id": "r1",
            "session": "s1",
            "agent": "rev",
            "status": "finished",
            "request_seq": 1,
            "started": started,
            "ended": ended,
        },
    ]


def row_line(seq: int, actor: str, sources: list[str] | None = None, **body: Any) -> dict[str, Any]:
    """Row ``seq`` of run r1 in s1, by ``actor``, with ``body`` (``message=…``, ``receipt=…``)."""
    return {
        "type": "row",
        "session": "s1",
        "seq": seq,
        "run": "r1",
        "actor": actor,
        "sources": sources or [],
        **body,
    }
