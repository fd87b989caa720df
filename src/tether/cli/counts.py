"""Counts in what the commands print: ``1 session``, ``2 sessions``, ``0 runs``."""

from __future__ import annotations

__all__ = ["counted", "counts"]

_IRREGULAR = {
    "entry": "entries",
    "directory": "directories",
}


def _plural(noun: str) -> str:
    head, _, last = noun.rpartition(" ")
    word = _IRREGULAR.get(last) or (last[:-1] + "ies" if last.endswith("ry") else last + "s")
    return f"{head} {word}" if head else word


def counted(n: float, noun: str, plural: str | None = None, *, thousands: bool = False) -> str:
    """``n`` and the noun, singular for exactly one: ``counted(1, "row")`` is ``1 row``,
    ``counted(3, "pi entry")`` is ``3 pi entries``; ``plural`` when the noun's is irregular.
    ``thousands`` groups the digits (``12,000 bytes``)."""
    number = f"{n:,}" if thousands else str(n)
    return f"{number} {noun if n == 1 else (plural or _plural(noun))}"


def counts(*items: tuple[int, str]) -> str:
    """Several counts joined with commas: ``counts((1, "session"), (4, "run"))`` is
    ``1 session, 4 runs``."""
    return ", ".join(counted(n, noun) for n, noun in items)
