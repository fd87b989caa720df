"""Ids of sessions, runs, actors and agents (docs/contracts.md#the-interchange-format): non-empty,
printable, one line.

An id travels into file names, log lines, JSON Lines and URLs; one that is empty or holds a
control character or a newline would load but could not be dumped and loaded again, or named on
a command line.
"""

from __future__ import annotations

from tether.errors import InvalidId

__all__ = ["MAX_ID_CHARS", "check_id", "id_problem", "new_run_id"]

MAX_ID_CHARS = 1024


def id_problem(value: object) -> str | None:
    """Why ``value`` is not a valid id, or None when it is one."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_CHARS:
        return f"must be at most {MAX_ID_CHARS} characters, not {len(value)}"
    if not value.isprintable():
        # isprintable() is False for newlines, tabs, other control and format characters,
        # separators other than the space, and lone surrogates
        bad = next(ch for ch in value if not ch.isprintable())
        return f"must be printable on one line (it holds {bad!a})"
    return None


def new_run_id() -> str:
    """A fresh run id (``r-`` and 12 hex digits)."""
    import uuid

    return f"r-{uuid.uuid4().hex[:12]}"


def check_id(kind: str, value: object) -> str:
    """``value`` when it is a valid id; else :class:`InvalidId` naming the ``kind`` of id."""
    problem = id_problem(value)
    if problem is not None or not isinstance(value, str):
        shown = ascii(value) if isinstance(value, str) and len(value) <= 80 else "the id"
        raise InvalidId(f"{kind} id {shown} {problem}")
    return value
