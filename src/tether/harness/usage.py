"""A run's token usage and cost, counted from pi's RPC records as they arrive
(:class:`UsageTally`), and the live budget of its actor (:func:`watch_budget`).

Where pi reports a provider call's usage:

- the task turn: every assistant ``message_end`` (pi's docs/json.md; a failed attempt pi retries
  included), and the ``compaction_end`` of a compaction pi makes on its own (its ``result.usage``);
- the continuation checkpoint's summary call: the ``compaction_end`` of the checkpoint the
  extension wrote (``result.details.continuation``; its ``result.usage`` is the summary call's,
  retries summed), or, when the extension refused the summary after a call, the refusal receipt
  it sends (``{"kind": "continuation_checkpoint_refused", …, "usage": {…}}``,
  extension/continuation.ts).

A resumed run replays pi's records from the start, so its tally is the whole run's. The tally
becomes the run's record (``extra["usage"]``, tether.usage) at its end, and the ledger's usage
rows with it (tether.ledger.usage).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import anyio

from tether.errors import FencedOut, LedgerError, RunNotActive
from tether.harness.context import ClaimedRun
from tether.harness.stops import StopControl, StopReason
from tether.ledger.usage import DayBudget
from tether.pi.client import Record, is_notify
from tether.pi.continuation import RECEIPT_KIND
from tether.pi.protocol import Event
from tether.threads import in_thread
from tether.usage import Part, RunUsage, Usage, day_start, usage_of

__all__ = ["BUDGET_RETRY_S", "UsageTally", "receipt_usage", "watch_budget"]

BUDGET_RETRY_S = 1.0
"""How long a live budget's write waits before trying again after the ledger failed."""


def receipt_usage(record: Record) -> Usage | None:
    """The summary call's usage a refusal receipt carries (an error ``notify`` of the
    continuation extension), if ``record`` is one that carries it."""
    if not is_notify(record) or not isinstance(record, dict):
        return None
    message = record.get("message")
    if record.get("notifyType") != "error" or not isinstance(message, str):
        return None
    if not message.startswith("{"):
        return None
    try:
        body = json.loads(message)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("kind") != RECEIPT_KIND:
        return None
    return usage_of(body.get("usage"))


def _is_checkpoint(result: Mapping[str, Any]) -> bool:
    details = result.get("details")
    return isinstance(details, dict) and isinstance(details.get("continuation"), dict)


class UsageTally:
    """What pi reported one run's provider calls used, by part, so far."""

    def __init__(self) -> None:
        self.task = Usage()
        self.checkpoint = Usage()
        self.version = 0
        """Bumped at each call counted (the live budget writes when it moves)."""
        self._moved: anyio.Event | None = None

    def see(self, item: Record) -> None:
        if not isinstance(item, dict):
            return
        kind = item.get("type")
        if kind == Event.MESSAGE_END:
            message = item.get("message")
            if isinstance(message, dict) and message.get("role") == "assistant":
                self._add(Part.TASK, usage_of(message.get("usage")))
        elif kind == Event.COMPACTION_END:
            result = item.get("result")
            if isinstance(result, dict):
                part = Part.CHECKPOINT if _is_checkpoint(result) else Part.TASK
                self._add(part, usage_of(result.get("usage")))
        elif kind == Event.EXTENSION_UI_REQUEST:
            self._add(Part.CHECKPOINT, receipt_usage(item))

    def _add(self, part: Part, found: Usage | None) -> None:
        if found is None:
            return
        if part is Part.TASK:
            self.task += found
        else:
            self.checkpoint += found
        self.version += 1
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    async def moved(self, seen: int) -> None:
        """Return once a call was counted after version ``seen`` (at once when one was)."""
        if self.version != seen:
            return
        if self._moved is None:
            self._moved = anyio.Event()
        await self._moved.wait()

    def value(self, *, model: str | None, provider: str | None) -> RunUsage:
        return RunUsage(model=model, provider=provider, task=self.task, checkpoint=self.checkpoint)


async def watch_budget(
    run: ClaimedRun, tally: UsageTally, budget: DayBudget, stop: StopControl
) -> None:
    """While the run goes: after each provider call, write its usage so far (fenced) and read
    what its actor used today, in one transaction; once that reaches the budget, stop the run
    softly (``budget_exhausted``: pi aborts and settles, the answer so far is kept). A ledger
    that fails is tried again at the next call (or in a second); a fenced-out write raises
    (the driver's guard stops the run as fenced out)."""
    agent = run.agent
    seen = 0
    while True:
        await tally.moved(seen)
        seen = tally.version
        usage = tally.value(model=agent.model, provider=agent.provider).to_json()
        now = time.time()
        try:
            used = await in_thread(run.ledger.record_usage, run.fence, usage, since=day_start(now))
        except (FencedOut, RunNotActive):
            raise
        except LedgerError:
            await anyio.sleep(BUDGET_RETRY_S)
            seen = -1  # write again, whatever was counted meanwhile
            continue
        refused = budget.exhausted(used, now)
        if refused is not None:
            stop.soft(StopReason.BUDGET_EXHAUSTED, str(refused))
            return
