"""Recall and notes (docs/contracts.md#recall-and-notes): searching and reading a session's
retained evidence for one
actor, and notes an agent leaves for its later runs. The CLI and the harness's tool server both
call this API."""

from __future__ import annotations

from tether.recall.recall import (
    MAX_ANSWER_BYTES,
    MAX_HITS,
    MAX_NOTE_BYTES,
    MAX_SNIPPET_BYTES,
    Hit,
    RecallAnswer,
    RecalledRow,
    RecallMode,
    add_note,
    read_range,
    search,
)

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_HITS",
    "MAX_NOTE_BYTES",
    "MAX_SNIPPET_BYTES",
    "Hit",
    "RecallAnswer",
    "RecallMode",
    "RecalledRow",
    "add_note",
    "read_range",
    "search",
]
