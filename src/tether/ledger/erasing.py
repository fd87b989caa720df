"""A session being erased (docs/operations.md#erasure-and-retention, issue 31): the marks that let
an erasure stop the
session's live run first, whichever process or host owns it, and keep any other from starting.

Both marks live in the session's record (``sessions.extra``), written under the session's
custody lock, so they travel through the ledger to every owner:

- ``erasing`` (:meth:`ErasingSql.begin_erasure`): the session refuses new prompts (its
  ``refusing`` says it is being erased, unless it refused already) and no queued run of it is
  claimed (:meth:`~tether.ledger.custody.CustodySql.claim_next` passes it by), so no run becomes
  live between the stop and the erasure. :meth:`ErasingSql.end_erasure` takes it away again (a
  session erased whole has nothing left to take it from); ``tether session clear`` does too,
  after an erasure that died half-way.
- ``stop_request`` (:meth:`ErasingSql.request_stop`): the live run is asked to stop, softly or
  at once; its harness reads it every second (:meth:`ErasingSql.stop_request`) and stops through
  its own ``StopControl``, so the run ends as any stopped run does, recorded by its owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from tether.ids import check_id
from tether.ledger import codec
from tether.ledger.base import SqlBase
from tether.ledger.codec import Cursor
from tether.ledger.models import Fence, now_iso
from tether.sizes import canonical_json

__all__ = [
    "ERASING_KEY",
    "STOP_KEY",
    "ErasingSql",
    "StopRequest",
    "clear_marks",
    "erasing_refusal",
    "is_erasing",
]

ERASING_KEY = "erasing"
"""The key of the erasing mark in a session's ``extra``."""
STOP_KEY = "stop_request"
"""The key of the stop request in a session's ``extra``."""


def erasing_refusal(actor: str, at: str) -> str:
    """What a session being erased says when it refuses a prompt."""
    return f"erasing: {actor} is erasing it (since {at})"


class StopRequest(msgspec.Struct, frozen=True):
    """A request that the session's live run ``run`` stop: softly (abort, let pi settle) or,
    with ``hard``, at once (pi killed)."""

    run: str
    hard: bool
    detail: str
    """Why, in words: the run's record keeps it as its error."""
    by: str
    at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "hard": self.hard,
            "detail": self.detail,
            "by": self.by,
            "at": self.at,
        }

    @classmethod
    def of(cls, raw: object) -> StopRequest | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("run"), str):
            return None
        return cls(
            run=raw["run"],
            hard=bool(raw.get("hard")),
            detail=str(raw.get("detail") or "a stop was requested"),
            by=str(raw.get("by") or ""),
            at=str(raw.get("at") or ""),
        )


class ErasingSql(SqlBase):
    """The erasing mark and stop requests of sessions."""

    def begin_erasure(
        self, sessions: Sequence[str], *, actor: str, idle_before: str | None = None
    ) -> list[str]:
        """Mark ``sessions`` as being erased (see the module). Returns those marked: the ones
        that exist and, with ``idle_before``, are still idle then (no run queued or running,
        nothing newer: the rule retention erases by), checked under the same lock."""
        check_id("actor", actor)
        at = now_iso()
        marked: list[str] = []
        for session in sessions:
            with self._tx() as c:
                self._lock_session(c, session)
                c.execute("SELECT refusing, extra FROM sessions WHERE id = ?", (session,))
                found = c.fetchone()
                if found is None:
                    continue
                if idle_before is not None and not self._idle(c, session, idle_before):
                    continue
                extra = codec.loads_extra(found[1])
                refusing = found[0]
                mark = {"actor": actor, "at": at, "refusing": None}
                if not refusing:
                    refusing = mark["refusing"] = erasing_refusal(actor, at)
                extra[ERASING_KEY] = mark
                extra.pop(STOP_KEY, None)
                c.execute(
                    "UPDATE sessions SET refusing = ?, extra = ? WHERE id = ?",
                    (refusing, canonical_json(extra), session),
                )
                marked.append(session)
        return marked

    @staticmethod
    def _idle(c: Cursor, session: str, before: str) -> bool:
        c.execute(
            "SELECT 1 FROM sessions s WHERE s.id = ? AND s.created < ? "
            "AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.session = s.id AND ("
            "r.status IN ('queued', 'running') OR r.started >= ? OR r.ended >= ?)) "
            "AND NOT EXISTS (SELECT 1 FROM notes n WHERE n.session = s.id AND n.at >= ?)",
            (session, before, before, before, before),
        )
        return c.fetchone() is not None

    def end_erasure(self, sessions: Sequence[str]) -> None:
        """Take the erasing mark and any stop request away (sessions that are gone are passed
        by). The refusal the mark set goes with it; one set otherwise (a run that ended with its
        idle unconfirmed) stays."""
        for session in sessions:
            with self._tx() as c:
                self._lock_session(c, session)
                clear_marks(c, session)

    def request_stop(self, run_id: str, *, hard: bool, detail: str, actor: str) -> bool:
        """Ask the live run ``run_id`` to stop (see the module); False when it is not running.
        The run's record names who asked (``stopped_by``, and ``stop_asked``: hard or not, when),
        written with the request, before its harness can see it and end the run."""
        check_id("actor", actor)
        at = now_iso()
        with self._tx() as c:
            # The run's row lock first, as an append takes it (then the session's row).
            c.execute(
                "UPDATE runs SET epoch = epoch WHERE id = ? AND status = 'running' "
                "RETURNING session, extra",
                (run_id,),
            )
            run = c.fetchone()
            if run is None:
                return False
            self._lock_session(c, run[0])
            c.execute("SELECT extra FROM sessions WHERE id = ?", (run[0],))
            found = c.fetchone()
            extra = codec.loads_extra(found[0] if found else None)
            extra[STOP_KEY] = StopRequest(run_id, hard, detail, actor, at).to_json()
            c.execute("UPDATE sessions SET extra = ? WHERE id = ?", (canonical_json(extra), run[0]))
            asked = {
                **codec.loads_extra(run[1]),
                "stopped_by": actor,
                "stop_asked": {"hard": hard, "at": at},
            }
            c.execute("UPDATE runs SET extra = ? WHERE id = ?", (canonical_json(asked), run_id))
        return True

    def stop_request(self, fence: Fence) -> StopRequest | None:
        """The stop asked of the run ``fence`` holds, if any (one primary-key read)."""
        with self._read() as c:
            c.execute("SELECT extra FROM sessions WHERE id = ?", (fence.session,))
            found = c.fetchone()
        if found is None:
            return None
        asked = StopRequest.of(codec.loads_extra(found[0]).get(STOP_KEY))
        return asked if asked is not None and asked.run == fence.run else None


def is_erasing(c: Cursor, session: str) -> bool:
    """Inside a transaction: the session is being erased (its runs are not to be claimed)."""
    c.execute("SELECT extra FROM sessions WHERE id = ?", (session,))
    found = c.fetchone()
    return found is not None and ERASING_KEY in codec.loads_extra(found[0])


def clear_marks(c: Cursor, session: str) -> None:
    """Inside a transaction: take the erasing mark and the stop request away, and the refusal
    the mark set (not another)."""
    c.execute("SELECT refusing, extra FROM sessions WHERE id = ?", (session,))
    found = c.fetchone()
    if found is None:
        return
    extra = codec.loads_extra(found[1])
    mark = extra.pop(ERASING_KEY, None)
    stop = extra.pop(STOP_KEY, None)
    if mark is None and stop is None:
        return
    refusing = found[0]
    if isinstance(mark, dict) and mark.get("refusing") and refusing == mark["refusing"]:
        refusing = None
    c.execute(
        "UPDATE sessions SET refusing = ?, extra = ? WHERE id = ?",
        (refusing, canonical_json(extra), session),
    )
