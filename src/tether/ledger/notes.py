"""Notes an agent leaves for its later runs on a session: added, and read newest first within
a count and a byte bound (they travel whole into every follow-up)."""

from __future__ import annotations

from collections.abc import Sequence

from tether.ids import check_id
from tether.ledger import codec
from tether.ledger.base import SqlBase
from tether.ledger.lineage import NO_BOUND, lineage
from tether.ledger.models import (
    Note,
    now_iso,
)

__all__ = ["DEFAULT_NOTES_BYTES", "DEFAULT_NOTES_COUNT", "NotesSql"]

# Notes travel whole into every follow-up, so their reads are bounded by count and bytes.
DEFAULT_NOTES_COUNT = 32
DEFAULT_NOTES_BYTES = 16_000


class NotesSql(SqlBase):
    """Notes."""

    def add_note(
        self,
        session_id: str,
        agent: str,
        text: str,
        *,
        at: str | None = None,
        actor: str | None = None,
        run: str | None = None,
        sources: Sequence[str] = (),
    ) -> Note:
        check_id("agent", agent)
        note = Note(
            session=session_id,
            agent=agent,
            text=text,
            at=at or now_iso(),
            actor=actor,
            run=run,
            sources=tuple(sorted(set(sources))),
        )
        with self._tx() as c:
            self._insert_note(c, note)
        return note

    def notes(
        self,
        session_id: str,
        agent: str,
        *,
        max_count: int = DEFAULT_NOTES_COUNT,
        max_bytes: int = DEFAULT_NOTES_BYTES,
    ) -> list[Note]:
        """The newest notes of an agent on a session that fit both bounds, oldest first."""
        with self._read() as c:
            picked: list[Note] = []
            total = 0
            # The session's own notes first (the newest), then a fork's inherited ones.
            for seg in lineage(c, session_id):
                bound, params = _id_bound(seg.max_note)
                c.execute(
                    f"SELECT {codec.NOTE_COLS}, bytes FROM notes WHERE session = ? AND agent = ?"
                    f"{bound} ORDER BY id DESC LIMIT ?",
                    (seg.session, agent, *params, max_count - len(picked)),
                )
                for r in c.fetchall():
                    if total + r[-1] > max_bytes:
                        picked.reverse()
                        return picked
                    total += r[-1]
                    picked.append(codec.note_of(session_id, r))
                if len(picked) >= max_count:
                    break
        picked.reverse()
        return picked

    def all_notes(self, session_id: str) -> list[Note]:
        with self._read() as c:
            found: list[Note] = []
            for seg in reversed(lineage(c, session_id)):
                bound, params = _id_bound(seg.max_note)
                c.execute(
                    f"SELECT {codec.NOTE_COLS} FROM notes WHERE session = ?{bound} ORDER BY id",
                    (seg.session, *params),
                )
                found += [codec.note_of(session_id, r) for r in c.fetchall()]
            return found


def _id_bound(max_note: int) -> tuple[str, tuple[int, ...]]:
    # The bound only where there is one (a fork's inherited notes): the plain read is the one
    # the notes_by_agent index serves.
    return ("", ()) if max_note >= NO_BOUND else (" AND id <= ?", (max_note,))
