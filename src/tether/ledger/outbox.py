"""The webhooks' outbox: run ends as events, and their deliveries to endpoints, durable in the
ledger (``tether.service.webhooks`` sends them).

- A run's end writes its event (``run.ended``, with a fresh event id) in the transaction that
  ends it (:meth:`OutboxSql._record_run_end`, called by ``end_run`` and ``end_queued_run``): a run
  that ended has its event, whoever ended it (a worker, ``tether run``, a reconcile, a stop), and
  a process dying right after loses nothing.
- A delivering process fans new events out (:meth:`OutboxSql.fan_out`): one delivery per
  configured endpoint whose filters take the event, keyed ``(event, endpoint)``, so a second
  fan-out of the same event adds nothing. An endpoint added later gets the events fanned out
  after it was configured.
- Deliveries are claimed per endpoint (:meth:`OutboxSql.claim_deliveries`), oldest due first,
  ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (SQLite serializes writers), under a lease: the
  attempt is counted and ``due`` moves to the lease's end, so an attempt cut short by a crash is
  due again then, on any process. Its outcome: :meth:`~OutboxSql.delivery_sent` (a 2xx),
  :meth:`~OutboxSql.delivery_failed` (retry at a time, or give up), or
  :meth:`~OutboxSql.delivery_dropped` (the run is gone, or its session is not the endpoint's).
- :meth:`OutboxSql.prune_outbox` removes settled deliveries and their events after a while.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from typing import NamedTuple, Protocol

import msgspec

from tether.ledger.base import Engine, SqlBase
from tether.ledger.codec import Cursor
from tether.ledger.models import now_iso

__all__ = ["Delivery", "DeliveryState", "Outbox", "OutboxSql", "Route"]

RUN_ENDED = "run.ended"


class DeliveryState:
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    """Given up after the last attempt."""
    DROPPED = "dropped"
    """Not sent: the run is gone (erased), or the endpoint may not see its session."""


class Route(NamedTuple):
    """An endpoint as the fan-out sees it: its url (the key of its deliveries), and the event
    types and run statuses it takes."""

    endpoint: str
    kinds: Collection[str]
    statuses: Collection[str]


class Delivery(msgspec.Struct, frozen=True):
    """One event for one endpoint."""

    id: int
    event_id: str
    kind: str
    run: str
    session: str
    status: str
    at: str
    endpoint: str
    attempts: int
    """Attempts so far, the one just claimed included."""
    state: str = DeliveryState.PENDING
    due: float = 0.0
    last_status: int | None = None
    last_error: str | None = None
    done_at: str | None = None


_DELIVERY_COLS = (
    "d.id, e.event_id, e.kind, e.run, e.session, e.status, e.at, d.endpoint, d.attempts, "
    "d.state, d.due, d.last_status, d.last_error, d.done_at"
)
_FROM = "webhook_deliveries d JOIN webhook_events e ON e.id = d.event"


def _delivery(r: Sequence[object]) -> Delivery:
    return Delivery(
        id=int(r[0]),  # type: ignore[call-overload]
        event_id=str(r[1]),
        kind=str(r[2]),
        run=str(r[3]),
        session=str(r[4]),
        status=str(r[5]),
        at=str(r[6]),
        endpoint=str(r[7]),
        attempts=int(r[8]),  # type: ignore[call-overload]
        state=str(r[9]),
        due=float(r[10]),  # type: ignore[arg-type]
        last_status=None if r[11] is None else int(r[11]),  # type: ignore[call-overload]
        last_error=None if r[12] is None else str(r[12]),
        done_at=None if r[13] is None else str(r[13]),
    )


def _ids(n: int) -> str:
    return ", ".join("?" * n)


class Outbox(Protocol):
    """The webhooks' outbox (a role of the ledger)."""

    def fan_out(self, routes: Sequence[Route], *, limit: int = ...) -> int: ...
    def claim_deliveries(
        self,
        endpoint: str,
        *,
        owner: str,
        lease_s: float,
        limit: int = ...,
        now: float | None = ...,
    ) -> list[Delivery]: ...
    def delivery_sent(self, delivery_id: int, *, status: int) -> bool: ...
    def delivery_failed(
        self,
        delivery_id: int,
        *,
        owner: str,
        error: str,
        status: int | None = ...,
        retry_at: float | None,
    ) -> bool: ...
    def delivery_dropped(self, delivery_id: int, *, reason: str) -> bool: ...
    def deliveries(
        self, *, run: str | None = ..., endpoint: str | None = ..., limit: int = ...
    ) -> list[Delivery]: ...
    def prune_outbox(self, *, before: str, endpoints: Collection[str]) -> int: ...


class OutboxSql(SqlBase):
    """The outbox's statements, for both engines."""

    @property
    def _skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self.engine is Engine.POSTGRES else ""

    def _record_run_end(self, c: Cursor, run_id: str) -> None:
        """Inside the transaction that ended ``run_id``: its ``run.ended`` event (one per run;
        a second end of the same run, which custody never makes, would add none)."""
        c.execute(
            "INSERT INTO webhook_events (event_id, kind, run, session, status, at) "
            "SELECT ?, ?, id, session, status, ? FROM runs WHERE id = ? "
            "ON CONFLICT (run, kind) DO NOTHING",
            (f"evt_{uuid.uuid4().hex}", RUN_ENDED, now_iso(), run_id),
        )

    def fan_out(self, routes: Sequence[Route], *, limit: int = 500) -> int:
        """Turn up to ``limit`` new events into deliveries, one per route that takes each
        (none when there are no routes: the events are settled as they are). Returns how many
        events it fanned out (0: none was waiting)."""
        # A read first: a poll that finds nothing takes no write lock (SQLite has one).
        with self._read() as c:
            c.execute("SELECT 1 FROM webhook_events WHERE fanned = 0 LIMIT 1")
            if c.fetchone() is None:
                return 0
        with self._tx() as c:
            c.execute(
                "SELECT id, kind, status FROM webhook_events WHERE fanned = 0 "
                f"ORDER BY id LIMIT ?{self._skip_locked}",
                (limit,),
            )
            events = c.fetchall()
            if not events:
                return 0
            now = time.time()
            made = [
                (int(eid), route.endpoint, now)
                for eid, kind, status in events
                for route in routes
                if kind in route.kinds and status in route.statuses
            ]
            if made:
                c.executemany(
                    "INSERT INTO webhook_deliveries (event, endpoint, state, attempts, due) "
                    "VALUES (?, ?, 'pending', 0, ?) ON CONFLICT (event, endpoint) DO NOTHING",
                    made,
                )
            ids = [int(e[0]) for e in events]
            c.execute(f"UPDATE webhook_events SET fanned = 1 WHERE id IN ({_ids(len(ids))})", ids)
        return len(events)

    def claim_deliveries(
        self,
        endpoint: str,
        *,
        owner: str,
        lease_s: float,
        limit: int = 16,
        now: float | None = None,
    ) -> list[Delivery]:
        """Take up to ``limit`` of the endpoint's deliveries that are due, oldest due first:
        each attempt is counted now and the delivery is due again when the lease ends (an
        attempt that never reports, its process killed, is made again then)."""
        now = time.time() if now is None else now
        with self._read() as c:  # as in fan_out: an idle poll takes no write lock
            c.execute(
                "SELECT 1 FROM webhook_deliveries WHERE endpoint = ? AND state = 'pending' "
                "AND due <= ? LIMIT 1",
                (endpoint, now),
            )
            if c.fetchone() is None:
                return []
        with self._tx() as c:
            c.execute(
                "SELECT id FROM webhook_deliveries WHERE endpoint = ? AND state = 'pending' "
                f"AND due <= ? ORDER BY due, id LIMIT ?{self._skip_locked}",
                (endpoint, now, limit),
            )
            ids = [int(r[0]) for r in c.fetchall()]
            if not ids:
                return []
            c.execute(
                "UPDATE webhook_deliveries SET attempts = attempts + 1, due = ?, owner = ? "
                f"WHERE id IN ({_ids(len(ids))})",
                (now + lease_s, owner, *ids),
            )
            c.execute(
                f"SELECT {_DELIVERY_COLS} FROM {_FROM} WHERE d.id IN ({_ids(len(ids))}) "
                "ORDER BY d.due, d.id",
                ids,
            )
            return [_delivery(r) for r in c.fetchall()]

    def delivery_sent(self, delivery_id: int, *, status: int) -> bool:
        """The endpoint answered 2xx: delivered (whoever holds the lease now: the event was
        sent, and a second sending would only repeat it). False when it was settled already."""
        with self._tx() as c:
            c.execute(
                "UPDATE webhook_deliveries SET state = 'delivered', last_status = ?, "
                "last_error = NULL, done_at = ? WHERE id = ? AND state = 'pending'",
                (status, now_iso(), delivery_id),
            )
            return bool(c.rowcount == 1)

    def delivery_failed(
        self,
        delivery_id: int,
        *,
        owner: str,
        error: str,
        status: int | None = None,
        retry_at: float | None,
    ) -> bool:
        """The attempt failed: due again at ``retry_at``, or given up (``failed``) without it.
        Only while ``owner`` holds the delivery (a newer claim's attempt decides otherwise)."""
        with self._tx() as c:
            if retry_at is None:
                c.execute(
                    "UPDATE webhook_deliveries SET state = 'failed', last_status = ?, "
                    "last_error = ?, done_at = ? WHERE id = ? AND owner = ? AND state = 'pending'",
                    (status, error[:2000], now_iso(), delivery_id, owner),
                )
            else:
                c.execute(
                    "UPDATE webhook_deliveries SET due = ?, last_status = ?, last_error = ? "
                    "WHERE id = ? AND owner = ? AND state = 'pending'",
                    (retry_at, status, error[:2000], delivery_id, owner),
                )
            return bool(c.rowcount == 1)

    def delivery_dropped(self, delivery_id: int, *, reason: str) -> bool:
        """Settle a delivery without sending it (``reason`` is kept as its last error)."""
        with self._tx() as c:
            c.execute(
                "UPDATE webhook_deliveries SET state = 'dropped', last_error = ?, done_at = ? "
                "WHERE id = ? AND state = 'pending'",
                (reason[:2000], now_iso(), delivery_id),
            )
            return bool(c.rowcount == 1)

    def deliveries(
        self, *, run: str | None = None, endpoint: str | None = None, limit: int = 1000
    ) -> list[Delivery]:
        """Deliveries (of a run's events, to an endpoint, or all), oldest event first."""
        where: list[str] = []
        params: list[object] = []
        if run is not None:
            where.append("e.run = ?")
            params.append(run)
        if endpoint is not None:
            where.append("d.endpoint = ?")
            params.append(endpoint)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        with self._read() as c:
            c.execute(
                f"SELECT {_DELIVERY_COLS} FROM {_FROM} {clause}ORDER BY e.id, d.id LIMIT ?",
                (*params, limit),
            )
            return [_delivery(r) for r in c.fetchall()]

    def prune_outbox(self, *, before: str, endpoints: Collection[str]) -> int:
        """Remove what is settled and older than ``before`` (an ISO time, as events keep it):
        deliveries delivered, failed or dropped, and those still pending for an endpoint no
        longer configured (not in ``endpoints``); then the fanned-out events left without a
        delivery. Returns how many events went."""
        kept = list(endpoints)
        with self._tx() as c:
            unconfigured = f" OR d.endpoint NOT IN ({_ids(len(kept))})" if kept else " OR 1 = 1"
            c.execute(
                "DELETE FROM webhook_deliveries WHERE id IN (SELECT d.id FROM "
                f"{_FROM} WHERE e.at < ? AND (d.state <> 'pending'{unconfigured}))",
                (before, *kept),
            )
            c.execute(
                "DELETE FROM webhook_events WHERE fanned = 1 AND at < ? AND NOT EXISTS "
                "(SELECT 1 FROM webhook_deliveries d WHERE d.event = webhook_events.id)",
                (before,),
            )
            return int(c.rowcount)
