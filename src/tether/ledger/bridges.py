"""What chat bridges keep in the ledger (docs/bridges.md, ``tether.bridges``): which session a chat
thread is, where each bridge's event stream was read to, which platform events became which
runs, and a durable outbox of the messages a bridge posts.

Every table is keyed by the bridge's name (``"matrix:@tether:example.org"``: the platform and the
bot account), so several bridges, and several processes of one bridge, share one ledger:

- a thread's session is decided once (:meth:`BridgeSql.thread_session`: the first insert wins,
  every process reads the winner);
- an event becomes a run at most once (the run is keyed by the event id, ``enqueue_run``'s
  ``request_id``), and is recorded once (:meth:`BridgeSql.record_event`);
- a message is queued once per key (``answer:<run>``, ``refusal:<event>``, …) and claimed under
  a lease, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so one process posts it; its parts are
  posted with transaction ids derived from the row (``txn``), so a retry after a crash repeats
  the same platform event instead of posting a second one.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Sequence
from typing import Protocol

import msgspec

from tether.ledger.base import Engine, SqlBase
from tether.ledger.models import now_iso

__all__ = ["BridgeMessage", "BridgeSql", "Bridges", "MessageKind", "MessageState", "PendingAnswer"]


class MessageKind(enum.StrEnum):
    """What a bridge's outgoing message is: how the platform shows it."""

    ANSWER = "answer"
    """A run's answer (or its failure), in the thread."""
    NOTICE = "notice"
    """A one-line explanation: a refusal, a control word's reply, an encrypted room."""


class MessageState(enum.StrEnum):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"
    """Given up after the last attempt."""


class BridgeMessage(msgspec.Struct, frozen=True):
    """One outgoing message of a bridge, as claimed."""

    id: int
    bridge: str
    key: str
    room: str
    root: str
    kind: MessageKind
    body: str
    txn: str
    """The row's own random part of its platform transaction ids (one per part)."""
    parts_sent: int
    attempts: int
    state: MessageState = MessageState.PENDING
    last_error: str | None = None


class PendingAnswer(msgspec.Struct, frozen=True):
    """A run a bridge queued that has ended and whose answer is not queued yet."""

    event: str
    room: str
    root: str
    run: str


_MSG_COLS = "id, bridge, key, room, root, kind, body, txn, parts_sent, attempts, state, last_error"


def _message(r: Sequence[object]) -> BridgeMessage:
    return BridgeMessage(
        id=int(r[0]),  # type: ignore[call-overload]
        bridge=str(r[1]),
        key=str(r[2]),
        room=str(r[3]),
        root=str(r[4]),
        kind=MessageKind(str(r[5])),
        body=str(r[6]),
        txn=str(r[7]),
        parts_sent=int(r[8]),  # type: ignore[call-overload]
        attempts=int(r[9]),  # type: ignore[call-overload]
        state=MessageState(str(r[10])),
        last_error=None if r[11] is None else str(r[11]),
    )


class Bridges(Protocol):
    """The chat bridges' part of the ledger (a role)."""

    def thread_session(
        self, bridge: str, room: str, root: str, *, session: str, agent: str
    ) -> tuple[str, str]: ...
    def thread_of(self, bridge: str, room: str, root: str) -> tuple[str, str] | None: ...
    def bridge_cursor(self, bridge: str) -> str | None: ...
    def set_bridge_cursor(self, bridge: str, token: str) -> None: ...
    def record_event(self, bridge: str, event: str, *, room: str, root: str, run: str) -> bool: ...
    def event_run(self, bridge: str, event: str) -> str | None: ...
    def pending_answers(self, bridge: str, *, limit: int = ...) -> list[PendingAnswer]: ...
    def open_event_runs(self, bridge: str) -> list[tuple[str, str]]: ...
    def queue_message(
        self,
        bridge: str,
        key: str,
        *,
        room: str,
        root: str,
        kind: MessageKind,
        body: str,
        answered: str | None = ...,
    ) -> bool: ...
    def mark_answered(self, bridge: str, run: str) -> None: ...
    def claim_messages(
        self, bridge: str, *, owner: str, lease_s: float, limit: int = ..., now: float | None = ...
    ) -> list[BridgeMessage]: ...
    def message_part_sent(self, message_id: int, *, owner: str, parts_sent: int) -> bool: ...
    def message_sent(self, message_id: int) -> bool: ...
    def message_failed(
        self, message_id: int, *, owner: str, error: str, retry_at: float | None
    ) -> bool: ...
    def bridge_messages(self, bridge: str, *, limit: int = ...) -> list[BridgeMessage]: ...


class BridgeSql(SqlBase):
    """The bridges' statements, for both engines."""

    @property
    def _skip_locked_bridge(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self.engine is Engine.POSTGRES else ""

    # -- threads -------------------------------------------------------------------------------

    def thread_session(
        self, bridge: str, room: str, root: str, *, session: str, agent: str
    ) -> tuple[str, str]:
        """The (session, agent) of the thread ``root`` in ``room``: the stored one, or
        ``(session, agent)`` stored now. Two processes asking at once get the same answer."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO bridge_threads (bridge, room, root, session, agent, created) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (bridge, room, root) DO NOTHING",
                (bridge, room, root, session, agent, now_iso()),
            )
            c.execute(
                "SELECT session, agent FROM bridge_threads WHERE bridge = ? AND room = ? "
                "AND root = ?",
                (bridge, room, root),
            )
            r = c.fetchone()
        assert r is not None
        return str(r[0]), str(r[1])

    def thread_of(self, bridge: str, room: str, root: str) -> tuple[str, str] | None:
        """The (session, agent) of a thread the bridge has taken a request in, or None."""
        with self._read() as c:
            c.execute(
                "SELECT session, agent FROM bridge_threads WHERE bridge = ? AND room = ? "
                "AND root = ?",
                (bridge, room, root),
            )
            r = c.fetchone()
        return None if r is None else (str(r[0]), str(r[1]))

    # -- the event stream's position -----------------------------------------------------------

    def bridge_cursor(self, bridge: str) -> str | None:
        with self._read() as c:
            c.execute("SELECT token FROM bridge_cursors WHERE bridge = ?", (bridge,))
            r = c.fetchone()
        return None if r is None else str(r[0])

    def set_bridge_cursor(self, bridge: str, token: str) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO bridge_cursors (bridge, token, at) VALUES (?, ?, ?) "
                "ON CONFLICT (bridge) DO UPDATE SET token = excluded.token, at = excluded.at",
                (bridge, token, now_iso()),
            )

    # -- events and their runs -----------------------------------------------------------------

    def record_event(self, bridge: str, event: str, *, room: str, root: str, run: str) -> bool:
        """Remember that ``event`` became ``run`` (its answer goes to ``root`` in ``room``);
        False when it was recorded already (a redelivery, or another process)."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO bridge_events (bridge, event, room, root, run, answered, at) "
                "VALUES (?, ?, ?, ?, ?, 0, ?) ON CONFLICT (bridge, event) DO NOTHING",
                (bridge, event, room, root, run, now_iso()),
            )
            return bool(c.rowcount == 1)

    def event_run(self, bridge: str, event: str) -> str | None:
        with self._read() as c:
            c.execute(
                "SELECT run FROM bridge_events WHERE bridge = ? AND event = ?", (bridge, event)
            )
            r = c.fetchone()
        return None if r is None else str(r[0])

    def pending_answers(self, bridge: str, *, limit: int = 100) -> list[PendingAnswer]:
        """The bridge's runs that have ended and whose answer is not queued yet, oldest first."""
        with self._read() as c:
            c.execute(
                "SELECT e.event, e.room, e.root, e.run FROM bridge_events e "
                "JOIN runs r ON r.id = e.run WHERE e.bridge = ? AND e.answered = 0 "
                "AND r.status IN ('finished', 'failed', 'interrupted') ORDER BY e.at LIMIT ?",
                (bridge, limit),
            )
            return [
                PendingAnswer(event=str(r[0]), room=str(r[1]), root=str(r[2]), run=str(r[3]))
                for r in c.fetchall()
            ]

    def open_event_runs(self, bridge: str) -> list[tuple[str, str]]:
        """(room, run) of the bridge's runs that are live now (a live run shows as typing)."""
        with self._read() as c:
            c.execute(
                "SELECT e.room, e.run FROM bridge_events e JOIN runs r ON r.id = e.run "
                "WHERE e.bridge = ? AND e.answered = 0 AND r.status = 'running'",
                (bridge,),
            )
            return [(str(r[0]), str(r[1])) for r in c.fetchall()]

    def mark_answered(self, bridge: str, run: str) -> None:
        """``run`` needs no post of its own (its request went into another run, which answers)."""
        with self._tx() as c:
            c.execute(
                "UPDATE bridge_events SET answered = 1 WHERE bridge = ? AND run = ?", (bridge, run)
            )

    # -- the outbox ----------------------------------------------------------------------------

    def queue_message(
        self,
        bridge: str,
        key: str,
        *,
        room: str,
        root: str,
        kind: MessageKind,
        body: str,
        answered: str | None = None,
    ) -> bool:
        """Queue a message under ``key`` (unique per bridge: a second queueing adds nothing and
        answers False). ``answered``: the run whose answer this is, marked answered in the same
        transaction, so a crash between the two neither loses nor doubles it."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO bridge_outbox (bridge, key, room, root, kind, body, txn, state, "
                "parts_sent, attempts, due, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', 0, 0, ?, ?) "
                "ON CONFLICT (bridge, key) DO NOTHING",
                (
                    bridge,
                    key,
                    room,
                    root,
                    kind.value,
                    body,
                    uuid.uuid4().hex,
                    time.time(),
                    now_iso(),
                ),
            )
            made = bool(c.rowcount == 1)
            if answered is not None:
                c.execute(
                    "UPDATE bridge_events SET answered = 1 WHERE bridge = ? AND run = ?",
                    (bridge, answered),
                )
            return made

    def claim_messages(
        self,
        bridge: str,
        *,
        owner: str,
        lease_s: float,
        limit: int = 16,
        now: float | None = None,
    ) -> list[BridgeMessage]:
        """Take up to ``limit`` of the bridge's messages that are due, oldest first: each
        attempt is counted now and the message is due again when the lease ends (an attempt
        whose process died is made again then, by any process, with the same transaction ids)."""
        now = time.time() if now is None else now
        with self._read() as c:  # an idle poll takes no write lock (SQLite has one)
            c.execute(
                "SELECT 1 FROM bridge_outbox WHERE bridge = ? AND state = 'pending' AND due <= ? "
                "LIMIT 1",
                (bridge, now),
            )
            if c.fetchone() is None:
                return []
        with self._tx() as c:
            c.execute(
                "SELECT id FROM bridge_outbox WHERE bridge = ? AND state = 'pending' AND due <= ? "
                f"ORDER BY id LIMIT ?{self._skip_locked_bridge}",
                (bridge, now, limit),
            )
            ids = [int(r[0]) for r in c.fetchall()]
            if not ids:
                return []
            marks = ", ".join("?" * len(ids))
            c.execute(
                "UPDATE bridge_outbox SET attempts = attempts + 1, due = ?, owner = ? "
                f"WHERE id IN ({marks})",
                (now + lease_s, owner, *ids),
            )
            c.execute(
                f"SELECT {_MSG_COLS} FROM bridge_outbox WHERE id IN ({marks}) ORDER BY id", ids
            )
            return [_message(r) for r in c.fetchall()]

    def message_part_sent(self, message_id: int, *, owner: str, parts_sent: int) -> bool:
        """The first ``parts_sent`` parts are posted (a retry starts after them)."""
        with self._tx() as c:
            c.execute(
                "UPDATE bridge_outbox SET parts_sent = ? WHERE id = ? AND owner = ? "
                "AND state = 'pending' AND parts_sent < ?",
                (parts_sent, message_id, owner, parts_sent),
            )
            return bool(c.rowcount == 1)

    def message_sent(self, message_id: int) -> bool:
        with self._tx() as c:
            c.execute(
                "UPDATE bridge_outbox SET state = 'sent', last_error = NULL, done_at = ? "
                "WHERE id = ? AND state = 'pending'",
                (now_iso(), message_id),
            )
            return bool(c.rowcount == 1)

    def message_failed(
        self, message_id: int, *, owner: str, error: str, retry_at: float | None
    ) -> bool:
        """The attempt failed: due again at ``retry_at``, or given up without it; only while
        ``owner`` holds the message."""
        with self._tx() as c:
            if retry_at is None:
                c.execute(
                    "UPDATE bridge_outbox SET state = 'failed', last_error = ?, done_at = ? "
                    "WHERE id = ? AND owner = ? AND state = 'pending'",
                    (error[:2000], now_iso(), message_id, owner),
                )
            else:
                c.execute(
                    "UPDATE bridge_outbox SET due = ?, last_error = ? "
                    "WHERE id = ? AND owner = ? AND state = 'pending'",
                    (retry_at, error[:2000], message_id, owner),
                )
            return bool(c.rowcount == 1)

    def bridge_messages(self, bridge: str, *, limit: int = 1000) -> list[BridgeMessage]:
        """The bridge's messages, oldest first (for tests and operators)."""
        with self._read() as c:
            c.execute(
                f"SELECT {_MSG_COLS} FROM bridge_outbox WHERE bridge = ? ORDER BY id LIMIT ?",
                (bridge, limit),
            )
            return [_message(r) for r in c.fetchall()]
