"""The ledger's sessions: created (or on first use), listed, their last seq, and refusing
new prompts."""

from __future__ import annotations

from typing import Any

from tether.errors import AlreadyExists, NotFound
from tether.ids import check_id
from tether.ledger import codec
from tether.ledger.base import SqlBase
from tether.ledger.erasing import clear_marks
from tether.ledger.models import (
    RunStatus,
    Session,
    now_iso,
)
from tether.sizes import canonical_json

__all__ = ["CLEARS_KEPT", "SessionsSql"]

CLEARS_KEPT = 20
"""The receipts of clears a session keeps (the newest)."""


class SessionsSql(SqlBase):
    """Sessions."""

    def create_session(
        self, session_id: str, *, created: str | None = None, extra: dict[str, Any] | None = None
    ) -> Session:
        check_id("session", session_id)
        s = Session(id=session_id, created=created or now_iso(), extra=extra or {})
        try:
            with self._tx() as c:
                c.execute(
                    "INSERT INTO sessions (id, created, extra) VALUES (?, ?, ?)",
                    (s.id, s.created, canonical_json(s.extra)),
                )
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise AlreadyExists(f"session {session_id!r} already exists") from exc
            raise
        return s

    def ensure_session(self, session_id: str) -> Session:
        """The session, created on first use."""
        found = self.session(session_id)
        if found is not None:
            return found
        try:
            return self.create_session(session_id)
        except AlreadyExists:
            return self.get_session(session_id)

    def session(self, session_id: str) -> Session | None:
        with self._read() as c:
            c.execute(
                "SELECT id, created, refusing, extra FROM sessions WHERE id = ?", (session_id,)
            )
            r = c.fetchone()
        return (
            Session(id=r[0], created=r[1], refusing=r[2], extra=codec.loads_extra(r[3]))
            if r
            else None
        )

    def get_session(self, session_id: str) -> Session:
        found = self.session(session_id)
        if found is None:
            raise NotFound(f"no session {session_id!r}; `tether sessions` lists them")
        return found

    def sessions(self, *, limit: int = 1000) -> list[Session]:
        with self._read() as c:
            c.execute(
                "SELECT id, created, refusing, extra FROM sessions ORDER BY created, id LIMIT ?",
                (limit,),
            )
            return [
                Session(id=r[0], created=r[1], refusing=r[2], extra=codec.loads_extra(r[3]))
                for r in c.fetchall()
            ]

    def session_overview(
        self, *, limit: int = 200
    ) -> list[tuple[Session, int, dict[RunStatus, int]]]:
        """The newest sessions first, each with its last seq and its run counts by status (two
        bounded reads, whatever the number of rows; for the service's pages)."""
        with self._read() as c:
            c.execute(
                "SELECT id, created, refusing, extra, last_seq FROM sessions "
                "ORDER BY created DESC, id DESC LIMIT ?",
                (limit,),
            )
            found = c.fetchall()
            counts: dict[str, dict[RunStatus, int]] = {r[0]: {} for r in found}
            if found:
                marks = ", ".join("?" for _ in found)
                c.execute(
                    f"SELECT session, status, COUNT(*) FROM runs WHERE session IN ({marks}) "
                    "GROUP BY session, status",
                    [r[0] for r in found],
                )
                for session, status, n in c.fetchall():
                    counts[session][RunStatus(status)] = int(n)
        return [
            (
                Session(id=r[0], created=r[1], refusing=r[2], extra=codec.loads_extra(r[3])),
                int(r[4] or 0),
                counts[r[0]],
            )
            for r in found
        ]

    def last_seq(self, session_id: str) -> int:
        with self._read() as c:
            c.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,))
            r = c.fetchone()
        if r is None:
            raise NotFound(f"no session {session_id!r}")
        return int(r[0])

    def clear_refusing(
        self, session_id: str, *, actor: str, pi_checked: bool = False
    ) -> str | None:
        """Let the session take prompts again, as ``set_refusing(session, None)`` does, and keep
        a receipt in its record (``extra["cleared"]``, the newest :data:`CLEARS_KEPT`: who, when,
        the refusal it took away, whether the operator said it checked pi by hand). Returns that
        refusal (None: there was none, and nothing is written)."""
        check_id("actor", actor)
        with self._tx() as c:
            self._lock_session(c, session_id)
            c.execute("SELECT refusing FROM sessions WHERE id = ?", (session_id,))
            found = c.fetchone()
            if found is None:
                raise NotFound(f"no session {session_id!r}")
            was = found[0]
            clear_marks(c, session_id)
            if not was:
                return None
            c.execute("SELECT extra FROM sessions WHERE id = ?", (session_id,))
            extra = codec.loads_extra(c.fetchone()[0])
            receipt = {"by": actor, "at": now_iso(), "was": was, "pi_checked": pi_checked}
            extra["cleared"] = [*(extra.get("cleared") or []), receipt][-CLEARS_KEPT:]
            c.execute(
                "UPDATE sessions SET refusing = NULL, extra = ? WHERE id = ?",
                (canonical_json(extra), session_id),
            )
        return str(was)

    def set_refusing(self, session_id: str, reason: str | None) -> None:
        """Mark the session as refusing new prompts (or clear it with ``None``: an erasure that
        died half-way leaves its marks, which go too, :mod:`tether.ledger.erasing`)."""
        with self._tx() as c:
            if reason is None:
                clear_marks(c, session_id)
            c.execute("UPDATE sessions SET refusing = ? WHERE id = ?", (reason, session_id))
            if c.rowcount != 1:
                raise NotFound(f"no session {session_id!r}")
