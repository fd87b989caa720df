"""Following pi's event stream: what the run has seen so far (``RunState``), tether's own events
for subscribers, and pokes that tell the mirror something was appended."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import msgspec

from tether.events import (
    AnswerDelta,
    Compacted,
    Compacting,
    EventBus,
    Notice,
    Retrying,
    Settled,
    StrayOutput,
    ToolFinished,
    ToolStarted,
    TurnStarted,
)
from tether.harness.stops import StopControl, StopReason
from tether.mirror.entries import message_text
from tether.mirror.mirror import Mirror
from tether.pi.client import Closed, Record, Stray
from tether.pi.protocol import Event, UiMethod

__all__ = ["MAX_STRAYS", "RunState", "follower", "on_record"]

MAX_STRAYS = 100
"""Non-protocol stdout lines tolerated (each reported) before the run fails as a protocol error."""
STRAY_SAMPLES = 5


class RunState(msgspec.Struct):
    """What the run has seen of pi so far (observations only: what the run comes to is a
    value the driver returns, not a flag here)."""

    turns: int = 0
    tool_calls: int = 0
    retries: int = 0
    answer: str | None = None
    last_assistant: dict[str, Any] | None = None
    settled: bool = False
    settled_aborted: bool = False
    closed_reason: str | None = None
    strays: int = 0
    stray_samples: list[str] = msgspec.field(default_factory=list)
    extension_errors: list[str] = msgspec.field(default_factory=list)
    done: anyio.Event = msgspec.field(default_factory=anyio.Event)
    """Set when pi settled or its transport closed."""


def follower(
    state: RunState,
    *,
    bus: EventBus,
    stop: StopControl,
    mirror: Mirror,
    trace: Callable[[Record], None] | None = None,
    watch: Sequence[Callable[[Record], None]] = (),
) -> Callable[[Record], None]:
    """What follows the client's records (``RpcClient.listening``), in its reader: ``trace``
    sees each first (the run's ``chat`` and ``execute_tool`` spans, when it is traced), then
    each of ``watch`` (the run's bounds and its usage tally), then :func:`on_record`. The last
    record, ``Closed``, sets ``state.done``."""

    def see(item: Record) -> None:
        if trace is not None:
            trace(item)
        for watcher in watch:
            watcher(item)
        on_record(item, state, bus=bus, stop=stop, mirror=mirror)

    return see


def on_record(
    item: Record, state: RunState, *, bus: EventBus, stop: StopControl, mirror: Mirror
) -> None:
    if isinstance(item, Closed):
        state.closed_reason = item.reason
        state.done.set()
        mirror.poke()
        return
    if isinstance(item, Stray):
        state.strays += 1
        text = item.line.decode("utf-8", "replace")
        if len(state.stray_samples) < STRAY_SAMPLES:
            state.stray_samples.append(text[:200])
        bus.emit(StrayOutput(line=text, problem=item.problem))
        if state.strays > MAX_STRAYS:
            stop.stop_hard(
                StopReason.PROTOCOL_ERROR,
                f"pi wrote {state.strays} lines to stdout that are not RPC records "
                f"(first: {state.stray_samples[0]!r})",
            )
        return
    kind = item.get("type")
    if kind == Event.MESSAGE_UPDATE:
        update = item.get("assistantMessageEvent") or {}
        if update.get("type") == "text_delta" and isinstance(update.get("delta"), str):
            bus.emit(AnswerDelta(update["delta"]))
        return
    if kind == Event.TURN_START:
        state.turns += 1
        bus.emit(TurnStarted(state.turns))
    elif kind == Event.MESSAGE_END:
        mirror.heard(item)  # pi announced an entry: the mirror writes only what pi announced
        message = item.get("message") or {}
        if message.get("role") == "assistant":
            state.last_assistant = message
            text = message_text(message)
            if text.strip():
                state.answer = text
        mirror.poke()
    elif kind == Event.TOOL_EXECUTION_START:
        state.tool_calls += 1
        bus.emit(
            ToolStarted(str(item.get("toolCallId")), str(item.get("toolName")), item.get("args"))
        )
    elif kind == Event.TOOL_EXECUTION_END:
        bus.emit(
            ToolFinished(
                str(item.get("toolCallId")),
                str(item.get("toolName")),
                bool(item.get("isError")),
                item.get("durationMs"),
            )
        )
    elif kind == Event.AUTO_RETRY_START:
        state.retries += 1
        bus.emit(
            Retrying(
                int(item.get("attempt", 0)),
                int(item.get("maxAttempts", 0)),
                str(item.get("errorMessage", "")),
            )
        )
    elif kind == Event.COMPACTION_START:
        bus.emit(Compacting(str(item.get("reason"))))
    elif kind == Event.COMPACTION_END:
        mirror.heard(item)
        error = item.get("errorMessage")
        bus.emit(
            Compacted(
                reason=str(item.get("reason")),
                ok=item.get("result") is not None,
                aborted=bool(item.get("aborted")),
                error=error if isinstance(error, str) else None,
            )
        )
        mirror.poke()
    elif kind == Event.AGENT_SETTLED:
        state.settled = True
        state.settled_aborted = bool(item.get("aborted"))
        bus.emit(Settled(state.settled_aborted))
        mirror.poke()
        state.done.set()
    elif kind == Event.EXTENSION_ERROR:
        message = (
            f"extension {item.get('extensionPath')} failed in {item.get('event')}: "
            f"{item.get('error')}"
        )
        state.extension_errors.append(message)
        bus.emit(Notice(level="error", message=message))
    elif kind == Event.EXTENSION_UI_REQUEST and item.get("method") == UiMethod.NOTIFY:
        bus.emit(
            Notice(
                level=str(item.get("notifyType") or "info"),
                message=str(item.get("message", "")),
            )
        )
    elif kind == Event.ENTRY_APPENDED:
        mirror.heard(item)
        mirror.poke()
    elif kind == Event.QUEUE_UPDATE:
        mirror.heard(item)  # a relayed request's text, which pi will write as a user message
    elif kind in (Event.TURN_END, Event.AGENT_END):
        mirror.poke()
