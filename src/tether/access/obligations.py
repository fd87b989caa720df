"""A run's cumulative source obligations (docs/security.md): every row a run writes carries the
union
of the sources of everything the run was given (its view, recalled rows), so an answer derived
from a withheld row is withheld like it."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Obligations"]


class Obligations:
    """Grows only: sources are added as the run is given more (a recall), never removed."""

    def __init__(self, sources: Iterable[str] = ()) -> None:
        self._sources: set[str] = set(sources)

    def add(self, sources: Iterable[str]) -> None:
        self._sources.update(sources)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(sorted(self._sources))

    def stamp(self, own: Iterable[str]) -> tuple[str, ...]:
        """A row's own sources with the run's obligations added."""
        return tuple(sorted(self._sources.union(own)))
