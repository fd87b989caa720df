"""Runs and their custody (docs/architecture.md#custody): the queue of requests, claims under an
owner epoch,
leases and placements, take-overs by a reconciler, fenced ends; and the run records the follow-up
reads (the newest ended runs of an agent)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import msgspec

from tether.errors import AlreadyExists, NotFound, RunNotActive
from tether.ids import check_id, new_run_id
from tether.images import ended_extra
from tether.ledger import codec
from tether.ledger.codec import Cursor
from tether.ledger.erasing import is_erasing
from tether.ledger.limits import RunLimits, check_limits
from tether.ledger.lineage import NO_BOUND, lineage
from tether.ledger.models import (
    ENDED_STATUSES,
    Fence,
    Lease,
    Run,
    RunStatus,
    now_iso,
)
from tether.ledger.outbox import OutboxSql
from tether.ledger.sessions import SessionsSql
from tether.ledger.usage import DayBudget, UsageSql, check_budget
from tether.sizes import canonical_json
from tether.usage import USAGE_KEY

__all__ = ["CustodySql"]


class CustodySql(SessionsSql, OutboxSql, UsageSql):
    """Runs, the queue and custody."""

    def create_run(
        self,
        session_id: str,
        agent: str,
        *,
        run_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Run:
        """A queued run. Refused while the session is refusing prompts."""
        check_id("agent", agent)
        rid = check_id("run", run_id) if run_id is not None else new_run_id()
        try:
            with self._tx() as c:
                self._check_takes_prompts(c, session_id)
                c.execute(
                    "INSERT INTO runs (id, session, agent, status, epoch, extra) "
                    "VALUES (?, ?, ?, 'queued', 0, ?)",
                    (rid, session_id, agent, canonical_json(extra or {})),
                )
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise AlreadyExists(f"run {rid!r} already exists") from exc
            raise
        return Run(
            id=rid, session=session_id, agent=agent, status=RunStatus.QUEUED, extra=extra or {}
        )

    def run(self, run_id: str) -> Run | None:
        with self._read() as c:
            c.execute(f"SELECT {codec.RUN_COLS} FROM runs WHERE id = ?", (run_id,))
            r = c.fetchone()
        return codec.run_of(r) if r else None

    def get_run(self, run_id: str) -> Run:
        found = self.run(run_id)
        if found is None:
            raise NotFound(f"no run {run_id!r}")
        return found

    def runs(self, session_id: str, *, limit: int = 100_000) -> list[Run]:
        with self._read() as c:
            found: list[Run] = []
            # A fork's inherited runs come first (older), then its own.
            for seg in reversed(lineage(c, session_id)):
                bound, params = _ord_bound(seg.max_ord)
                c.execute(
                    f"SELECT {codec.RUN_COLS} FROM runs WHERE session = ?{bound} "
                    "ORDER BY ord LIMIT ?",
                    (seg.session, *params, limit - len(found)),
                )
                found += [_as(session_id, codec.run_of(r)) for r in c.fetchall()]
                if len(found) >= limit:
                    break
            return found

    def update_queued_extra(self, run_id: str, extra: dict[str, Any]) -> bool:
        """Merge fields into a run's record while it is still queued; False once it was
        claimed (or ended)."""
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ? AND status = 'queued'", (run_id,))
            r = c.fetchone()
            if r is None:
                return False
            c.execute(
                "UPDATE runs SET extra = ? WHERE id = ? AND status = 'queued'",
                (canonical_json({**codec.loads_extra(r[0]), **extra}), run_id),
            )
            return bool(c.rowcount == 1)

    def end_queued_run(
        self, run_id: str, status: RunStatus, *, extra: dict[str, Any] | None = None
    ) -> Run | None:
        """End a run that is still queued, without running it (e.g. its request was delivered
        into the live run); None when it is no longer queued (someone claimed it)."""
        if status not in ENDED_STATUSES:
            raise ValueError(f"{status} is not an ending status")
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ? AND status = 'queued'", (run_id,))
            r = c.fetchone()
            if r is None:
                return None
            merged = ended_extra({**codec.loads_extra(r[0]), **(extra or {})})
            c.execute(
                "UPDATE runs SET status = ?, ended = ?, extra = ? "
                "WHERE id = ? AND status = 'queued'",
                (status.value, now_iso(), canonical_json(merged), run_id),
            )
            if c.rowcount != 1:
                return None
            self._record_run_end(c, run_id)  # the webhooks' event (tether.ledger.outbox)
        return self.get_run(run_id)

    def run_counts(self) -> dict[RunStatus, int]:
        """How many runs there are in each status (for the service's metrics)."""
        with self._read() as c:
            c.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")
            found = {RunStatus(r[0]): int(r[1]) for r in c.fetchall()}
        return {status: found.get(status, 0) for status in RunStatus}

    def claim_run(self, run_id: str) -> Fence:
        """Take ownership of a queued or running run. Each claim bumps the owner epoch; writes
        under an older fence are rejected from then on."""
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET epoch = epoch + 1, status = 'running', "
                "started = COALESCE(started, ?) "
                "WHERE id = ? AND status IN ('queued', 'running') RETURNING session, epoch",
                (now_iso(), run_id),
            )
            r = c.fetchone()
        if r is None:
            found = self.run(run_id)
            if found is None:
                raise NotFound(f"no run {run_id!r}")
            raise RunNotActive(f"run {run_id!r} is {found.status.value}; it cannot be claimed")
        return Fence(run=run_id, session=r[0], epoch=int(r[1]))

    def enqueue_run(
        self,
        session_id: str,
        agent: str,
        *,
        actor: str,
        text: str,
        request_id: str | None = None,
        run_id: str | None = None,
        waiter: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        limits: RunLimits | None = None,
        budget: DayBudget | None = None,
    ) -> tuple[Run, bool]:
        """A ``queued`` run carrying its request in ``extra["request"]`` (the request row is
        written when the run starts), the session created on first use. The same
        ``(session, request_id)`` again returns ``(that run, False)`` and writes nothing.
        Refused (``SessionRefusing``) while the session refuses prompts. ``waiter`` records the
        process that waits to run it itself (``tether run``), so a waiter that died can be
        withdrawn from the queue (:meth:`waited_heads`). ``extra`` is more of the run's record,
        written with it (what a worker must see the moment it can claim the run, such as the
        trace it continues). With ``limits`` (the service's), the actor's limits are counted
        in the transaction of the insert, under the actor's lock (:mod:`tether.ledger.limits`):
        over one, ``LimitExceeded`` and nothing is written, not even the new session; a
        repeated ``request_id`` is answered before the limits are counted. With ``budget``
        (the service's ``[service.budgets]``), an actor whose day is at its budget is refused
        the same way, before the limits (``BudgetExhausted``, :mod:`tether.ledger.usage`)."""
        check_id("agent", agent)
        check_id("actor", actor)
        rid = check_id("run", run_id) if run_id is not None else new_run_id()
        admitted = limits is not None or budget is not None
        if not admitted:
            self.ensure_session(session_id)
        else:
            check_id("session", session_id)
        extra = {
            **(extra or {}),
            "request": {"text": text, "actor": actor, "request_id": request_id},
        }
        try:
            with self._tx() as c:
                now = time.time()
                if admitted:
                    self._lock_actor(c, actor)
                    if request_id is not None and (found := _by_request(c, session_id, request_id)):
                        return found, False
                    if budget is not None:
                        check_budget(c, budget, now)
                    if limits is not None:
                        check_limits(c, actor, limits, now)
                    c.execute(
                        "INSERT INTO sessions (id, created) VALUES (?, ?) "
                        "ON CONFLICT (id) DO NOTHING",
                        (session_id, now_iso()),
                    )
                self._check_takes_prompts(c, session_id)
                c.execute(
                    "INSERT INTO runs (id, session, agent, status, epoch, extra, request_id, "
                    "placement, actor, created_epoch) VALUES (?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?)",
                    (
                        rid,
                        session_id,
                        agent,
                        canonical_json(extra),
                        request_id,
                        canonical_json(waiter) if waiter else None,
                        actor,
                        now,
                    ),
                )
        except Exception as exc:
            if not self._is_unique_violation(exc):
                raise
            if request_id is not None:
                with self._read() as c:
                    found = _by_request(c, session_id, request_id)
                if found is not None:
                    return found, False
            raise AlreadyExists(f"run {rid!r} already exists") from exc
        return (
            Run(id=rid, session=session_id, agent=agent, status=RunStatus.QUEUED, extra=extra),
            True,
        )

    def _claim_in(
        self,
        c: Cursor,
        session_id: str,
        run_id: str | None,
        owner: str,
        lease_s: float,
        live_limit: Callable[[str], int] | None = None,
    ) -> Fence | None:
        """Inside a transaction holding the session's custody lock: claim the session's
        oldest queued run (or ``run_id`` if it is the oldest) when no run of it is live. Without
        ``run_id``, a run a ``tether run`` waits for (its waiter is recorded) is not taken: it is
        that process's to run, with the pi it already started. With ``live_limit``, a run whose
        actor has that many runs live already is not taken (counted under the actor's lock)."""
        c.execute(
            "SELECT id FROM runs WHERE session = ? AND status = 'running' LIMIT 1", (session_id,)
        )
        if c.fetchone() is not None:
            return None
        if is_erasing(c, session_id):
            return None  # no run may become live between an erasure's stop and the erasure
        c.execute(
            "SELECT id, placement, actor FROM runs WHERE session = ? AND status = 'queued' "
            "ORDER BY ord LIMIT 1",
            (session_id,),
        )
        first = c.fetchone()
        if first is None or (run_id is not None and first[0] != run_id):
            return None
        if run_id is None and first[1]:
            return None
        if live_limit is not None and first[2] is not None:
            self._lock_actor(c, first[2])
            c.execute(
                "SELECT COUNT(*) FROM runs WHERE actor = ? AND status = 'running'", (first[2],)
            )
            if int(c.fetchone()[0]) >= live_limit(first[2]):
                return None  # its actor is at its bound: the run waits
        c.execute(
            "UPDATE runs SET epoch = epoch + 1, status = 'running', started = ?, owner = ?, "
            "lease_expires = ? WHERE id = ? AND status = 'queued' RETURNING epoch",
            (now_iso(), owner, time.time() + lease_s, first[0]),
        )
        r = c.fetchone()
        return Fence(run=first[0], session=session_id, epoch=int(r[0])) if r else None

    def claim_next(
        self,
        *,
        owner: str,
        lease_s: float,
        session: str | None = None,
        run_id: str | None = None,
        live_limit: Callable[[str], int] | None = None,
    ) -> Fence | None:
        """Atomically take the oldest queued run (FIFO by creation) of a session that has no
        live run: it becomes ``running`` with a new epoch and a lease held by ``owner``. With
        ``run_id``, that run only, and only when it is first in its session's queue and the
        session is free. With ``live_limit`` (actor -> its bound, the service's workers), a
        run is not taken while its actor has that many runs live. None when there is nothing
        to take."""
        if run_id is not None:
            found = self.run(run_id)
            if found is None:
                raise NotFound(f"no run {run_id!r}")
            if found.status is not RunStatus.QUEUED:
                raise RunNotActive(f"run {run_id!r} is {found.status.value}, not queued")
            session = found.session
        if session is not None:
            with self._tx() as c:
                self._lock_session(c, session)
                return self._claim_in(c, session, run_id, owner, lease_s, live_limit)
        with self._read() as c:
            # The actors at their bound: their queued runs are no candidates (a read of the
            # live runs, which are few).
            held: list[str] = []
            if live_limit is not None:
                c.execute(
                    "SELECT actor, COUNT(*) FROM runs WHERE status = 'running' "
                    "AND actor IS NOT NULL GROUP BY actor"
                )
                held = [a for a, n in c.fetchall() if int(n) >= live_limit(a)]
            # Candidates: the head of each free session's queue, oldest first.
            passed = ""
            if held:
                passed = f"AND (q.actor IS NULL OR q.actor NOT IN ({', '.join('?' * len(held))})) "
            c.execute(
                "SELECT q.session FROM runs q WHERE q.status = 'queued' AND NOT EXISTS "
                "(SELECT 1 FROM runs l WHERE l.session = q.session AND l.status = 'running') "
                f"{passed}GROUP BY q.session ORDER BY MIN(q.ord) LIMIT 64",
                held,
            )
            candidates = [r[0] for r in c.fetchall()]
        for sid in candidates:
            with self._tx() as c:
                # Another worker holding this session's lock is claiming it: skip, as
                # FOR UPDATE SKIP LOCKED would.
                if not self._lock_session(c, sid, wait=False):
                    continue
                fence = self._claim_in(c, sid, None, owner, lease_s, live_limit)
            if fence is not None:
                return fence
        return None

    def heartbeat(
        self, fence: Fence, *, lease_s: float, placement: dict[str, Any] | None = None
    ) -> None:
        """Extend the lease by ``lease_s`` from now and record the placement (fenced: raises
        ``FencedOut`` when a newer owner holds the run, ``RunNotActive`` when it ended)."""
        with self._tx() as c:
            if placement is None:
                self._check_fence(c, fence, "lease_expires = ?", (time.time() + lease_s,))
            else:
                self._check_fence(
                    c,
                    fence,
                    "lease_expires = ?, placement = ?",
                    (time.time() + lease_s, canonical_json(placement)),
                )

    def lease(self, run_id: str) -> Lease | None:
        """The custody record of a running run (None when the run is not running)."""
        with self._read() as c:
            c.execute(
                "SELECT id, session, epoch, owner, lease_expires, placement FROM runs "
                "WHERE id = ? AND status = 'running'",
                (run_id,),
            )
            r = c.fetchone()
        return codec.lease_of(r) if r else None

    def last_placement(self, session_id: str) -> tuple[str, dict[str, Any]] | None:
        """The newest started run of the session that recorded where it ran, with that placement
        (host, harness, pi and keeper pids with their start times, run directory): where a pi
        of the session's last run could still be left."""
        with self._read() as c:
            c.execute(
                "SELECT id, placement FROM runs WHERE session = ? AND started IS NOT NULL "
                "AND placement IS NOT NULL ORDER BY ord DESC LIMIT 1",
                (session_id,),
            )
            r = c.fetchone()
        return (str(r[0]), json.loads(r[1])) if r else None

    def live_runs(self, *, session: str | None = None) -> list[Run]:
        """Running runs (of one session, or all), oldest first."""
        where, params = ("AND session = ?", (session,)) if session is not None else ("", ())
        with self._read() as c:
            c.execute(
                f"SELECT {codec.RUN_COLS} FROM runs WHERE status = 'running' {where} ORDER BY ord",
                params,
            )
            return [codec.run_of(r) for r in c.fetchall()]

    def session_free(self, session_id: str) -> bool:
        """No run of the session is live or queued: a request now would run at once (so its
        pi is worth starting ahead; one that will wait holds no idle pi meanwhile)."""
        with self._read() as c:
            c.execute(
                "SELECT 1 FROM runs WHERE session = ? AND status IN ('running', 'queued') LIMIT 1",
                (session_id,),
            )
            return c.fetchone() is None

    def waited_heads(
        self, *, session: str | None = None, limit: int = 64
    ) -> list[tuple[Run, dict[str, Any]]]:
        """The first queued run of each session (or of ``session``) that has no live run, where
        a ``tether run`` waits for it, with that waiter (its placement): the runs workers pass
        by."""
        where, params = ("AND q.session = ? ", (session,)) if session is not None else ("", ())
        with self._read() as c:
            c.execute(
                f"SELECT {codec.RUN_COLS}, placement FROM runs q WHERE q.status = 'queued' "
                "AND q.placement IS NOT NULL AND q.ord = (SELECT MIN(h.ord) FROM runs h "
                "WHERE h.session = q.session AND h.status = 'queued') AND NOT EXISTS "
                "(SELECT 1 FROM runs l WHERE l.session = q.session AND l.status = 'running') "
                f"{where}ORDER BY q.ord LIMIT ?",
                (*params, limit),
            )
            return [(codec.run_of(r[:-1]), json.loads(r[-1])) for r in c.fetchall()]

    def queued_runs(self, session_id: str, *, limit: int = 1000) -> list[Run]:
        """A session's queued runs, in the order they will run."""
        with self._read() as c:
            c.execute(
                f"SELECT {codec.RUN_COLS} FROM runs WHERE session = ? AND status = 'queued' "
                "ORDER BY ord LIMIT ?",
                (session_id, limit),
            )
            return [codec.run_of(r) for r in c.fetchall()]

    def expired_leases(self, *, now: float | None = None, session: str | None = None) -> list[Run]:
        """Live runs (of ``session``, or all) whose lease has expired, or was never taken (a
        run claimed with ``claim_run`` holds no lease and counts as expired)."""
        now = time.time() if now is None else now
        where, params = ("AND session = ?", (session,)) if session is not None else ("", ())
        with self._read() as c:
            c.execute(
                f"SELECT {codec.RUN_COLS} FROM runs WHERE status = 'running' {where} "
                "AND (lease_expires IS NULL OR lease_expires <= ?) ORDER BY ord",
                (*params, now),
            )
            return [codec.run_of(r) for r in c.fetchall()]

    def take_over(
        self,
        run_id: str,
        *,
        epoch: int,
        owner: str,
        lease_s: float,
        placement: dict[str, Any] | None = None,
    ) -> Fence | None:
        """Claim a running run whose custody is being reconciled, only if its epoch is still
        ``epoch`` (compare and swap: of several reconcilers exactly one wins). The new owner
        holds a fresh lease and, when given, its ``placement`` replaces the old one (so no
        other reconciler takes the new owner for the lost one)."""
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET epoch = epoch + 1, owner = ?, lease_expires = ?, "
                "placement = COALESCE(?, placement) "
                "WHERE id = ? AND epoch = ? AND status = 'running' RETURNING session, epoch",
                (
                    owner,
                    time.time() + lease_s,
                    canonical_json(placement) if placement is not None else None,
                    run_id,
                    epoch,
                ),
            )
            r = c.fetchone()
        return Fence(run=run_id, session=r[0], epoch=int(r[1])) if r else None

    def cancel_queued(self, run_id: str) -> bool:
        """Withdraw a run that never started (it wrote nothing): True when it was removed."""
        with self._tx() as c:
            c.execute("DELETE FROM runs WHERE id = ? AND status = 'queued'", (run_id,))
            return c.rowcount == 1

    def end_run(
        self, fence: Fence, status: RunStatus, *, extra: dict[str, Any] | None = None
    ) -> Run:
        """Finish, fail or interrupt a run (fenced). ``extra`` is merged into the run's record."""
        if status not in ENDED_STATUSES:
            raise ValueError(f"{status} is not an ending status")
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ?", (fence.run,))
            r = c.fetchone()
            merged = ended_extra({**codec.loads_extra(r[0] if r else None), **(extra or {})})
            self._check_fence(
                c,
                fence,
                "status = ?, ended = ?, extra = ?",
                (status.value, now_iso(), canonical_json(merged)),
            )
            self._record_run_end(c, fence.run)  # the webhooks' event (tether.ledger.outbox)
            self._record_usage(c, fence.run, merged.get(USAGE_KEY))  # tether.ledger.usage
        return self.get_run(fence.run)

    def update_run_extra(self, fence: Fence, extra: dict[str, Any]) -> None:
        """Merge fields into a running run's record (fenced)."""
        with self._tx() as c:
            c.execute("SELECT extra FROM runs WHERE id = ?", (fence.run,))
            r = c.fetchone()
            merged = {**codec.loads_extra(r[0] if r else None), **extra}
            self._check_fence(c, fence, "extra = ?", (canonical_json(merged),))

    def last_ended_run(self, session_id: str, agent: str) -> Run | None:
        """The newest finished, failed or interrupted run of an agent on a session."""
        found = self.ended_runs(session_id, agent, limit=1)
        return found[0] if found else None

    def ended_runs(self, session_id: str, agent: str, *, limit: int = 32) -> list[Run]:
        """The newest finished, failed or interrupted runs of an agent, newest first."""
        with self._read() as c:
            found: list[Run] = []
            # The session's own runs first (the newest), then a fork's inherited ones.
            for seg in lineage(c, session_id):
                # The bound only where there is one: PostgreSQL's planner would otherwise walk
                # the primary key instead of runs_ended.
                bound, params = _ord_bound(seg.max_ord)
                c.execute(
                    f"SELECT {codec.RUN_COLS} FROM runs WHERE session = ? AND agent = ? "
                    f"AND status IN {codec.ENDED_IN}{bound} ORDER BY ord DESC LIMIT ?",
                    (seg.session, agent, *params, limit - len(found)),
                )
                found += [_as(session_id, codec.run_of(r)) for r in c.fetchall()]
                if len(found) >= limit:
                    break
            return found


def _by_request(c: Cursor, session_id: str, request_id: str) -> Run | None:
    c.execute(
        f"SELECT {codec.RUN_COLS} FROM runs WHERE session = ? AND request_id = ?",
        (session_id, request_id),
    )
    r = c.fetchone()
    return codec.run_of(r) if r else None


def _as(session_id: str, run: Run) -> Run:
    """A run as the session read sees it: an inherited run (a fork's) names the fork."""
    return run if run.session == session_id else msgspec.structs.replace(run, session=session_id)


def _ord_bound(max_ord: int) -> tuple[str, tuple[int, ...]]:
    return ("", ()) if max_ord >= NO_BOUND else (" AND ord <= ?", (max_ord,))
