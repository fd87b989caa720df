"""What one actor may ask for (the service's ``[service.limits]``), counted in the ledger: its
queued runs, its live runs and the runs it created in the last minute, from the runs table
(each run's ``actor`` and ``created_epoch``, migration 12, and its status).

The count and the insert it admits are one write transaction
(:meth:`~tether.ledger.custody.CustodySql.enqueue_run` with ``limits``), taken under the actor's
lock (:meth:`~tether.ledger.base.SqlBase._lock_actor`: an advisory lock on PostgreSQL; SQLite's
``BEGIN IMMEDIATE`` already serializes every write), so two processes, or hosts, admitting
requests of one actor at once never admit more than the limit between them.
"""

from __future__ import annotations

import enum
import math
import time
from typing import Any

import msgspec

from tether.errors import LedgerError
from tether.ledger.base import SqlBase
from tether.ledger.codec import Cursor

__all__ = [
    "WINDOW_S",
    "ActorLoad",
    "LimitExceeded",
    "LimitName",
    "LimitsSql",
    "RunLimits",
    "actor_load",
    "check_limits",
]

WINDOW_S = 60.0
"""The window of ``per_minute``."""
RETRY_BUSY_S = 5
"""Retry-After for the queued and live limits: when one of the actor's runs starts or ends is
not known, so a short wait, and the next try counts again."""


class LimitName(enum.StrEnum):
    QUEUED = "queued"
    LIVE = "live"
    PER_MINUTE = "per_minute"


class RunLimits(msgspec.Struct, frozen=True, kw_only=True):
    """One actor's bounds (None: that one is not checked)."""

    queued: int | None
    live: int | None
    per_minute: int | None


class ActorLoad(msgspec.Struct, frozen=True):
    """What an actor has in the ledger now: runs queued, runs live, and runs created in the
    last :data:`WINDOW_S` seconds (with the oldest of those's creation, seconds since the epoch)."""

    queued: int
    live: int
    last_minute: int
    oldest_in_minute: float | None


class LimitExceeded(LedgerError):
    """A request over one of its actor's limits: nothing was written."""

    def __init__(
        self, limit: LimitName, *, actor: str, allowed: int, current: int, retry_after_s: int
    ) -> None:
        self.limit = limit
        self.actor = actor
        self.allowed = allowed
        self.current = current
        self.retry_after_s = retry_after_s
        what = {
            LimitName.QUEUED: f"{current} queued runs",
            LimitName.LIVE: f"{current} live runs",
            LimitName.PER_MINUTE: f"made {current} requests in the last minute",
        }[limit]
        has = "" if limit is LimitName.PER_MINUTE else "has "
        super().__init__(
            f"{actor} {has}{what}, the most [service.limits] {limit.value} allows ({allowed}); "
            f"try again in {retry_after_s} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "limit": self.limit.value,
            "actor": self.actor,
            "allowed": self.allowed,
            "current": self.current,
            "retry_after_s": self.retry_after_s,
        }


def actor_load(c: Cursor, actor: str, now: float) -> ActorLoad:
    """Inside a transaction: the actor's load (two index reads: ``runs_open_by_actor`` and
    ``runs_by_actor``)."""
    c.execute(
        "SELECT status, COUNT(*) FROM runs WHERE actor = ? AND status IN ('queued', 'running') "
        "GROUP BY status",
        (actor,),
    )
    open_ = {str(r[0]): int(r[1]) for r in c.fetchall()}
    c.execute(
        "SELECT COUNT(*), MIN(created_epoch) FROM runs WHERE actor = ? AND created_epoch > ?",
        (actor, now - WINDOW_S),
    )
    recent = c.fetchone()
    return ActorLoad(
        queued=open_.get("queued", 0),
        live=open_.get("running", 0),
        last_minute=int(recent[0]) if recent else 0,
        oldest_in_minute=float(recent[1]) if recent and recent[1] is not None else None,
    )


def check_limits(c: Cursor, actor: str, limits: RunLimits, now: float) -> None:
    """Inside the transaction that would insert the actor's new run, under its lock: raise
    :class:`LimitExceeded` when the run would take it over a limit (requests a minute first,
    then queued, then live)."""
    load = actor_load(c, actor, now)
    if limits.per_minute is not None and load.last_minute >= limits.per_minute:
        oldest = load.oldest_in_minute if load.oldest_in_minute is not None else now
        raise LimitExceeded(
            LimitName.PER_MINUTE,
            actor=actor,
            allowed=limits.per_minute,
            current=load.last_minute,
            retry_after_s=max(1, math.ceil(oldest + WINDOW_S - now)),
        )
    for name, allowed, current in (
        (LimitName.QUEUED, limits.queued, load.queued),
        (LimitName.LIVE, limits.live, load.live),
    ):
        if allowed is not None and current >= allowed:
            raise LimitExceeded(
                name, actor=actor, allowed=allowed, current=current, retry_after_s=RETRY_BUSY_S
            )


class LimitsSql(SqlBase):
    """An actor's load, read (the service's admission counts it in its own transaction)."""

    def actor_load(self, actor: str, *, now: float | None = None) -> ActorLoad:
        with self._read() as c:
            return actor_load(c, actor, time.time() if now is None else now)
