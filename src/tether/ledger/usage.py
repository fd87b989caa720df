"""Token usage and cost in the ledger (tether.usage): one row per run and part (``task``,
``checkpoint``) in ``run_usage`` (migration 14 on SQLite, 11 on PostgreSQL), so that sums per
actor, agent and model are one indexed read, and the budgets of ``[service.budgets]``.

- A run's end writes its usage rows in the transaction that ends it, from the record's
  ``extra["usage"]`` (:meth:`UsageSql._record_usage`, called by ``end_run``): whoever ends the
  run, the rows and the record agree.
- A live run whose actor has a budget writes them as it goes (:meth:`UsageSql.record_usage`,
  fenced) and reads back, in the same transaction, what its actor used that day: the harness
  stops it softly once that crosses the budget (tether.harness.usage).
- A request is admitted only while its actor's day is under budget: the check is made in the
  transaction that would insert its run (``enqueue_run(budget=…)``, beside the limits of
  :mod:`tether.ledger.limits`), and over it :class:`BudgetExhausted` writes nothing.

A run's usage counts toward the UTC day its request was made (``runs.created_epoch``; a run
created otherwise, the day its usage was first written). The rows hold no text: an erasure
leaves them (a budget cannot be reset by erasing), with the ids of the run and its session.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import msgspec

from tether.config import ServiceBudgets
from tether.errors import LedgerError
from tether.ledger.base import SqlBase
from tether.ledger.codec import Cursor
from tether.ledger.models import Fence
from tether.usage import DAY_S, Part, Usage, day_start, recorded_usage

__all__ = [
    "GROUPS",
    "BudgetExhausted",
    "BudgetName",
    "DayBudget",
    "DayUsage",
    "UsageLine",
    "UsageRole",
    "UsageSql",
    "actor_day",
    "check_budget",
]

GROUPS = ("actor", "agent", "model")
"""The columns usage can be summed by."""

_UPSERT = (
    "INSERT INTO run_usage (run, part, session, actor, agent, model, at, calls, input, output, "
    "cache_read, cache_write, total_tokens, cost) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (run, part) DO UPDATE SET model = excluded.model, calls = excluded.calls, "
    "input = excluded.input, output = excluded.output, cache_read = excluded.cache_read, "
    "cache_write = excluded.cache_write, total_tokens = excluded.total_tokens, "
    "cost = excluded.cost"
)


class DayUsage(NamedTuple):
    """What an actor's runs used in one day."""

    tokens: int
    cost: float


class BudgetName(enum.StrEnum):
    TOKENS = "tokens_per_day"
    COST = "cost_per_day"


class DayBudget(msgspec.Struct, frozen=True, kw_only=True):
    """One actor's budget for a day (None: that one is not bounded)."""

    actor: str
    tokens: int | None = None
    cost: float | None = None

    def __bool__(self) -> bool:
        return self.tokens is not None or self.cost is not None

    @classmethod
    def of(cls, budgets: ServiceBudgets, actor: str) -> DayBudget | None:
        """``actor``'s budget in ``[service.budgets]``; None when it has none."""
        tokens, cost = budgets.of(actor)
        found = cls(actor=actor, tokens=tokens, cost=cost)
        return found if found else None

    def exhausted(self, used: DayUsage, now: float) -> BudgetExhausted | None:
        """The refusal when ``used`` reaches the budget (tokens first, then cost)."""
        retry = max(1, math.ceil(day_start(now) + DAY_S - now))
        if self.tokens is not None and used.tokens >= self.tokens:
            return BudgetExhausted(
                BudgetName.TOKENS,
                actor=self.actor,
                allowed=self.tokens,
                used=used.tokens,
                retry_after_s=retry,
            )
        if self.cost is not None and used.cost >= self.cost:
            return BudgetExhausted(
                BudgetName.COST,
                actor=self.actor,
                allowed=self.cost,
                used=round(used.cost, 6),
                retry_after_s=retry,
            )
        return None


class BudgetExhausted(LedgerError):
    """An actor's usage of the day reached its budget: a request is refused, writing nothing
    (the service answers 429, tether.service.budgets); a live run is stopped softly."""

    def __init__(
        self,
        budget: BudgetName,
        *,
        actor: str,
        allowed: float,
        used: float,
        retry_after_s: int,
    ) -> None:
        self.budget = budget
        self.actor = actor
        self.allowed = allowed
        self.used = used
        self.retry_after_s = retry_after_s
        unit = "tokens" if budget is BudgetName.TOKENS else "USD"
        super().__init__(
            f"{actor}'s runs used {used:g} {unit} today (UTC), the most [service.budgets] "
            f"{budget.value} allows ({allowed:g}); the budget renews in {retry_after_s} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget.value,
            "actor": self.actor,
            "allowed": self.allowed,
            "used": self.used,
            "retry_after_s": self.retry_after_s,
        }


class UsageLine(msgspec.Struct, frozen=True, kw_only=True):
    """Summed usage of the runs of one actor, agent and model (a key not grouped by is None)."""

    actor: str | None = None
    agent: str | None = None
    model: str | None = None
    runs: int = 0
    task: Usage = Usage()
    checkpoint: Usage = Usage()

    @property
    def total(self) -> Usage:
        return self.task + self.checkpoint

    def to_json(self, by: Sequence[str] = GROUPS) -> dict[str, Any]:
        out: dict[str, Any] = {key: getattr(self, key) for key in by}
        out.update(
            runs=self.runs,
            task=self.task.to_json(),
            checkpoint=self.checkpoint.to_json(),
            total=self.total.to_json(),
        )
        return out


def actor_day(c: Cursor, actor: str, since: float) -> DayUsage:
    """Inside a transaction: what ``actor``'s runs used since ``since`` (an index range read,
    ``run_usage_by_actor``)."""
    c.execute(
        "SELECT COALESCE(SUM(total_tokens), 0), COALESCE(SUM(cost), 0) FROM run_usage "
        "WHERE actor = ? AND at >= ?",
        (actor, since),
    )
    r = c.fetchone()
    return DayUsage(int(r[0]), float(r[1])) if r else DayUsage(0, 0.0)


def check_budget(c: Cursor, budget: DayBudget, now: float) -> None:
    """Inside the transaction that would insert the actor's new run: raise
    :class:`BudgetExhausted` when the actor's day is already at its budget."""
    if not budget:
        return
    refused = budget.exhausted(actor_day(c, budget.actor, day_start(now)), now)
    if refused is not None:
        raise refused


class UsageRole(Protocol):
    """Usage, written by the harness and summed for ``tether usage``, ``/metrics`` and budgets."""

    def record_usage(self, fence: Fence, usage: Mapping[str, Any], *, since: float) -> DayUsage:
        """Write a live run's usage so far (fenced); what its actor used since ``since``."""
        ...

    def actor_usage(self, actor: str, *, since: float) -> DayUsage: ...

    def usage_totals(
        self,
        *,
        actor: str | None = ...,
        since: float | None = ...,
        until: float | None = ...,
        by: Sequence[str] = ...,
    ) -> list[UsageLine]:
        """Usage summed by ``by`` (a subset of :data:`GROUPS`), newest rows included."""
        ...


class UsageSql(SqlBase):
    """Usage rows, written with a run's end or as it goes, and their sums."""

    def _record_usage(self, c: Cursor, run_id: str, usage: object) -> None:
        """Inside a write transaction: the run's usage rows from its record's ``usage`` (as
        :func:`tether.usage.recorded_usage` reads it); nothing when it has none."""
        found = recorded_usage({"usage": usage})
        if found is None:
            return
        c.execute("SELECT session, agent, actor, created_epoch FROM runs WHERE id = ?", (run_id,))
        r = c.fetchone()
        if r is None:
            return
        session, agent, actor, created = r
        at = float(created) if created is not None else time.time()
        for part in Part:
            counted = found.part(part)
            if part is Part.CHECKPOINT and not counted:
                continue  # a run without a checkpoint call has no checkpoint row
            c.execute(
                _UPSERT,
                (
                    run_id,
                    part.value,
                    session,
                    actor,
                    agent,
                    found.model,
                    at,
                    counted.calls,
                    counted.input,
                    counted.output,
                    counted.cache_read,
                    counted.cache_write,
                    counted.total_tokens,
                    counted.cost,
                ),
            )

    def record_usage(self, fence: Fence, usage: Mapping[str, Any], *, since: float) -> DayUsage:
        with self._tx() as c:
            self._check_fence(c, fence)
            self._record_usage(c, fence.run, usage)
            c.execute("SELECT actor FROM runs WHERE id = ?", (fence.run,))
            r = c.fetchone()
            if r is None or r[0] is None:
                return DayUsage(0, 0.0)
            return actor_day(c, str(r[0]), since)

    def actor_usage(self, actor: str, *, since: float) -> DayUsage:
        with self._read() as c:
            return actor_day(c, actor, since)

    def usage_totals(
        self,
        *,
        actor: str | None = None,
        since: float | None = None,
        until: float | None = None,
        by: Sequence[str] = GROUPS,
    ) -> list[UsageLine]:
        unknown = [key for key in by if key not in GROUPS]
        if unknown:
            raise ValueError(f"usage is summed by {', '.join(GROUPS)}, not {unknown}")
        where, params = [], []
        for clause, value in (("actor = ?", actor), ("at >= ?", since), ("at < ?", until)):
            if value is not None:
                where.append(clause)
                params.append(value)
        keys = ", ".join([*by, "part"])
        sql = (
            f"SELECT {keys}, COUNT(*), SUM(calls), SUM(input), SUM(output), SUM(cache_read), "
            "SUM(cache_write), SUM(total_tokens), SUM(cost) FROM run_usage"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" GROUP BY {keys}"
        )
        with self._read() as c:
            c.execute(sql, params)
            found = c.fetchall()
        lines: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in found:
            key, part, rows = tuple(r[: len(by)]), Part(r[len(by)]), int(r[len(by) + 1])
            sums = [int(v or 0) for v in r[len(by) + 2 : -1]]
            counted = Usage(
                calls=sums[0],
                input=sums[1],
                output=sums[2],
                cache_read=sums[3],
                cache_write=sums[4],
                total_tokens=sums[5],
                cost=float(r[-1] or 0.0),
            )
            line = lines.setdefault(key, {"runs": 0, "task": Usage(), "checkpoint": Usage()})
            line[part.value] = line[part.value] + counted
            if part is Part.TASK:
                line["runs"] += rows
        return sorted(
            (UsageLine(**dict(zip(by, key, strict=True)), **line) for key, line in lines.items()),
            key=lambda u: tuple(str(getattr(u, k) or "") for k in by),
        )
