"""Token usage and cost, as pi reports them per provider call: the figures a run's record keeps
(``extra["usage"]``), the ledger sums (per actor, agent and model) and budgets bound.

pi's assistant messages (and a compaction's summary call) carry

    "usage": {"input": 812, "output": 64, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 876,
              "cost": {"input": 0.0024, "output": 0.00096, "cacheRead": 0, "cacheWrite": 0,
                       "total": 0.00336}}

(``cost`` in USD, from the model's price in pi's ``models.json``: 0 without one). A run's record
sums them per part, the task turn's provider calls apart from the continuation checkpoint's
summary call:

    "usage": {"model": "scripted", "provider": "local",
              "task": {"calls": 2, "input": 1624, "output": 128, "cache_read": 0,
                       "cache_write": 0, "total_tokens": 1752, "cost": 0.00672},
              "checkpoint": {"calls": 1, …}}

Light on purpose: the CLI (``tether log``, ``tether usage``) and the service read it without
loading the harness.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = [
    "DAY_S",
    "USAGE_KEY",
    "Part",
    "RunUsage",
    "Usage",
    "day_start",
    "figure",
    "recorded_usage",
    "usage_of",
    "usage_text",
]

USAGE_KEY = "usage"
"""The run record's ``extra`` key of its usage."""
DAY_S = 86_400.0


class Part(enum.StrEnum):
    """Which provider calls of a run: its task turn's, or its continuation checkpoint's."""

    TASK = "task"
    """Every provider call of the task turn (pi's own compactions during it included)."""
    CHECKPOINT = "checkpoint"
    """The continuation checkpoint's summary call (its retries included)."""


def _count(value: object) -> int:
    return int(value) if isinstance(value, int | float) and math.isfinite(value) else 0


def _money(value: object) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Summed usage of some provider calls."""

    calls: int = 0
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: float = 0.0
    """USD, as pi computes it (``cost.total``)."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            calls=self.calls + other.calls,
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            total_tokens=self.total_tokens + other.total_tokens,
            cost=self.cost + other.cost,
        )

    def __bool__(self) -> bool:
        return bool(self.calls or self.total_tokens or self.cost)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    @classmethod
    def from_json(cls, found: object) -> Usage:
        """A record's part (``{"calls", "input", …}``); zero for what is not one."""
        if not isinstance(found, Mapping):
            return cls()
        return cls(
            calls=_count(found.get("calls")),
            input=_count(found.get("input")),
            output=_count(found.get("output")),
            cache_read=_count(found.get("cache_read")),
            cache_write=_count(found.get("cache_write")),
            total_tokens=_count(found.get("total_tokens")),
            cost=_money(found.get("cost")),
        )


def usage_of(reported: object) -> Usage | None:
    """One provider call's usage as pi reports it (an assistant message's or a compaction's
    ``usage``); None when ``reported`` is not one."""
    if not isinstance(reported, Mapping):
        return None
    cost = reported.get("cost")
    total = reported.get("totalTokens")
    parts = [_count(reported.get(k)) for k in ("input", "output", "cacheRead", "cacheWrite")]
    return Usage(
        calls=1,
        input=parts[0],
        output=parts[1],
        cache_read=parts[2],
        cache_write=parts[3],
        total_tokens=_count(total) if isinstance(total, int | float) else sum(parts),
        cost=_money(cost.get("total")) if isinstance(cost, Mapping) else 0.0,
    )


class RunUsage(msgspec.Struct, frozen=True, kw_only=True):
    """A run's usage: the task turn's calls and the checkpoint's apart, and the model (as the
    agent names it) that made them."""

    model: str | None = None
    provider: str | None = None
    task: Usage = Usage()
    checkpoint: Usage = Usage()

    @property
    def total(self) -> Usage:
        return self.task + self.checkpoint

    def part(self, part: Part) -> Usage:
        return self.task if part is Part.TASK else self.checkpoint

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "provider": self.provider,
            "task": self.task.to_json(),
            "checkpoint": self.checkpoint.to_json(),
        }


def recorded_usage(extra: Mapping[str, Any]) -> RunUsage | None:
    """The usage a run's record keeps; None for a run that has none (not ended, ended before
    tether recorded usage, or a loaded run that did not carry it)."""
    found = extra.get(USAGE_KEY)
    if not isinstance(found, Mapping):
        return None
    model, provider = found.get("model"), found.get("provider")
    return RunUsage(
        model=model if isinstance(model, str) else None,
        provider=provider if isinstance(provider, str) else None,
        task=Usage.from_json(found.get("task")),
        checkpoint=Usage.from_json(found.get("checkpoint")),
    )


def _tokens(n: int) -> str:
    return f"{n:,} tokens"


def _cost(usd: float) -> str:
    return f"${usd:.4f}" if usd else ""


def figure(usage: Usage) -> str:
    """``1,752 tokens ($0.0067)``; the cost only when pi priced it."""
    cost = _cost(usage.cost)
    return _tokens(usage.total_tokens) + (f" ({cost})" if cost else "")


def usage_text(extra: Mapping[str, Any]) -> str | None:
    """``1,752 tokens ($0.0067), checkpoint 412 tokens`` for a run whose record keeps usage;
    None for one that keeps none."""
    found = recorded_usage(extra)
    if found is None:
        return None
    text = figure(found.task)
    if found.checkpoint:
        text += f", checkpoint {figure(found.checkpoint)}"
    return text


def day_start(now: float) -> float:
    """The start of ``now``'s UTC day (a budget's day), seconds since the epoch."""
    return math.floor(now / DAY_S) * DAY_S
