"""Grant patterns: an actor is admitted to a row when every source the row carries matches one of
the actor's patterns (shell-style, ``fnmatch``). A row that carries no source is open to all.

Grants are keyed by actor; a key may itself be a pattern (``"user:*" = ["doc:handbook"]``), and an
actor gets the patterns of every key it matches. No actor (``None``) has no grants.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase

__all__ = ["Admission", "matches"]


def matches(source: str, patterns: Iterable[str]) -> bool:
    """Whether ``source`` matches any of ``patterns`` (case-sensitive, ``*``, ``?``, ``[…]``)."""
    return any(fnmatchcase(source, p) for p in patterns)


class Admission:
    """The admission decisions of one requesting actor."""

    __slots__ = ("_admitted", "actor", "patterns")

    def __init__(self, grants: Mapping[str, Sequence[str]] | None, actor: str | None) -> None:
        self.actor = actor
        found: list[str] = []
        if actor is not None:
            for key, patterns in (grants or {}).items():
                if key == actor or fnmatchcase(actor, key):
                    found.extend(p for p in patterns if p not in found)
        self.patterns: tuple[str, ...] = tuple(found)
        # Sources repeat across a session's rows; decide each one once.
        self._admitted: dict[str, bool] = {}

    def admits_source(self, source: str) -> bool:
        known = self._admitted.get(source)
        if known is None:
            known = self._admitted[source] = matches(source, self.patterns)
        return known

    def admits(self, sources: Iterable[str]) -> bool:
        """Whether the actor may read something carrying all of ``sources``."""
        return all(self.admits_source(s) for s in sources)
