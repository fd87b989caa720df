"""A run's spans: ``invoke_agent`` for the run, ``chat`` per provider call (the task turn's,
from pi's events, and the checkpoint's summary) and ``execute_tool`` per tool call, and tether's
own: the queue wait, the view, the checkpoint decision, the takeover. Every call is a no-op when
tracing is off (:mod:`tether.telemetry`), so the driver never asks.

Names, kinds and ``gen_ai.*`` values follow OpenTelemetry's GenAI semantic conventions: the run
is an agent tether runs itself (``invoke_agent``, INTERNAL), each provider call is a CLIENT
``chat`` span whose ``gen_ai.provider.name`` comes from the provider's pi api and whose finish
reasons are the conventions' (:mod:`tether.telemetry.genai`), each tool call an INTERNAL
``execute_tool`` span.

The run's trace context is kept in its record (``extra["telemetry"]``): the parent it was
queued with (a service request's ``traceparent``), when it was queued, and its own
``invoke_agent`` span, which the spans of a run resumed by ``tether recover`` join.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import msgspec

from tether import telemetry
from tether.config import ProviderConfig
from tether.errors import LedgerError
from tether.followup import FollowupView
from tether.harness.turn import CheckpointResult, RunOutcome, RunRequest
from tether.ledger import Fence, Ledger, Run, RunStatus
from tether.pi.client import Record
from tether.pi.protocol import Event
from tether.telemetry import Span, genai
from tether.threads import in_thread

__all__ = ["KEY", "RunTrace", "queued_context", "run_trace", "takeover_span"]

KEY = "telemetry"
"""The run record's ``extra`` key of its trace context."""


def queued_context(traceparent: str | None) -> dict[str, Any]:
    """What a run is queued with (``extra["telemetry"]``): its parent (a valid
    ``traceparent``, kept even when this process does not trace: the worker may) and, when
    tracing, when it was queued; empty when there is neither."""
    found: dict[str, Any] = {}
    if telemetry.trace_id_of(traceparent):
        found["parent"] = traceparent
    if telemetry.tracer() is not None:
        found["queued_ns"] = telemetry.now_ns()
    return {KEY: found} if found else {}


def _usage(message: Mapping[str, Any]) -> dict[str, telemetry.Attr | None]:
    usage = message.get("usage")
    usage = usage if isinstance(usage, dict) else {}

    def count(key: str) -> int | None:
        value = usage.get(key)
        return int(value) if isinstance(value, int | float) else None

    return {
        "gen_ai.usage.input_tokens": count("input"),
        "gen_ai.usage.output_tokens": count("output"),
        "gen_ai.usage.cache_read.input_tokens": count("cacheRead"),
        "gen_ai.usage.cache_creation.input_tokens": count("cacheWrite"),
        "gen_ai.usage.reasoning.output_tokens": count("reasoning"),
        "gen_ai.response.model": _str(message.get("responseModel")) or _str(message.get("model")),
        "gen_ai.response.id": _str(message.get("responseId")),
        "gen_ai.response.finish_reasons": genai.finish_reasons(
            message.get("stopReason"), message.get("rawStopReason")
        ),
    }


CALL_ERRORS = {"error": "provider_error", "aborted": "aborted"}
"""pi's stop reason -> the ``error.type`` of a provider call that ended so: the provider failed
(a filter's stop included), or the call was aborted (a stop, the deadline)."""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


class RunTrace(msgspec.Struct):
    """The spans of one run, made as it goes (all no-ops when tracing is off)."""

    span: Span = msgspec.field(default_factory=lambda: telemetry.NO_SPAN)
    session: str = ""
    model: str | None = None
    provider: str | None = None
    """``gen_ai.provider.name`` (:func:`tether.telemetry.genai.provider_name`)."""
    server: tuple[str | None, int | None] = (None, None)
    """``server.address`` and ``server.port`` of the provider's endpoint."""
    _waiting_since: int | None = None
    _tools: dict[str, tuple[int, str]] = msgspec.field(default_factory=dict)
    _content: bool = False

    def __bool__(self) -> bool:
        return bool(self.span)

    def _child(
        self,
        name: str,
        attrs: Mapping[str, telemetry.Attr | None],
        *,
        start_ns: int | None = None,
        parent: Span | None = None,
        kind: str = "internal",
    ) -> Span:
        return telemetry.start(
            name, attrs, parent=parent or self.span, start_ns=start_ns, kind=kind
        )

    # -- before pi ----------------------------------------------------------------------------

    def queue_wait(self, queued_ns: int | None, claimed_ns: int) -> None:
        if self and queued_ns is not None:
            waited = self._child(
                "tether.queue.wait",
                {"tether.queue.wait_ms": max(0, claimed_ns - queued_ns) // 1_000_000},
                start_ns=queued_ns,
            )
            waited.end(claimed_ns)

    def view(self, view: FollowupView | None, started_ns: int) -> None:
        """The view the run starts from: bytes by part and the gaps it names."""
        if not self:
            return
        attrs: dict[str, telemetry.Attr | None] = {"tether.view.follow_up": view is not None}
        if view is not None:
            notices = sum(m.bytes for m in view.messages if m.synthetic)
            checkpoint = view.checkpoint.bytes if view.checkpoint else 0
            attrs.update(
                {
                    "tether.view.budget_bytes": view.budget,
                    "tether.view.bytes": view.bytes,
                    "tether.view.checkpoint_bytes": checkpoint,
                    "tether.view.notice_bytes": notices,
                    "tether.view.message_bytes": view.bytes - notices - checkpoint,
                    "tether.view.media_bytes": view.media_bytes,
                    "tether.view.messages": len(view.messages),
                    "tether.view.gaps": len(view.gaps),
                    "tether.view.gap_rows": sum(g.last - g.first + 1 for g in view.gaps),
                    "tether.view.checkpoint_seq": view.checkpoint.seq if view.checkpoint else None,
                    "tether.view.previous_request_mode": (
                        view.previous_request.mode.value if view.previous_request else None
                    ),
                }
            )
        self._child("tether.followup.view", attrs, start_ns=started_ns).end()

    def view_refused(self, reason: str, started_ns: int) -> None:
        if self:
            refused = self._child(
                "tether.followup.view", {"tether.view.refusal": reason}, start_ns=started_ns
            )
            refused.fail("view_refused")
            refused.end()

    # -- pi's events ----------------------------------------------------------------------------

    def on_record(self, item: Record) -> None:
        """A ``chat`` span per assistant message (a provider call: from the turn's start or
        the last tool result to the message's end), an ``execute_tool`` span per tool call."""
        if not self or not isinstance(item, dict):
            return
        kind = item.get("type")
        now = telemetry.now_ns()
        if kind == Event.TURN_START:
            self._waiting_since = now
        elif kind == Event.MESSAGE_END:
            message = item.get("message") or {}
            if message.get("role") == "assistant":
                self._chat(message, self._waiting_since or now, now, purpose="task")
            self._waiting_since = now
        elif kind == Event.TOOL_EXECUTION_START:
            call = str(item.get("toolCallId"))
            self._tools[call] = (now, str(item.get("toolName")))
        elif kind == Event.TOOL_EXECUTION_END:
            self._tool(item, now)

    def _chat(
        self,
        message: Mapping[str, Any],
        start_ns: int,
        end_ns: int,
        *,
        purpose: str,
        parent: Span | None = None,
    ) -> None:
        """A CLIENT ``chat`` span: one provider call, named for the model asked for."""
        model = self.model or _str(message.get("model"))
        address, port = self.server
        chat = self._child(
            f"chat {model}" if model else "chat",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.conversation.id": self.session,
                "gen_ai.provider.name": self.provider,
                "gen_ai.request.model": model,
                "server.address": address,
                "server.port": port if address else None,
                "tether.chat.purpose": purpose,
                **_usage(message),
            },
            start_ns=start_ns,
            parent=parent,
            kind="client",
        )
        stop = message.get("stopReason")
        if isinstance(stop, str) and stop in CALL_ERRORS:
            chat.fail(CALL_ERRORS[stop])
        chat.end(end_ns)

    def _tool(self, item: Mapping[str, Any], now: int) -> None:
        call = str(item.get("toolCallId"))
        started, name = self._tools.pop(call, (now, str(item.get("toolName"))))
        tool = self._child(
            f"execute_tool {name}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call,
                "gen_ai.tool.type": "function",
                "gen_ai.conversation.id": self.session,
                "tether.tool.duration_ms": (now - started) // 1_000_000,
            },
            start_ns=started,
            kind="internal",
        )
        if item.get("isError"):
            tool.fail("tool_error")
        tool.end(now)

    # -- the checkpoint and the end ----------------------------------------------------------

    def checkpoint(
        self, result: CheckpointResult, facts: Mapping[str, Any], start_ns: int | None
    ) -> None:
        """The checkpoint decision: written, refused and why, or not tried and why; under it,
        the summary's provider call (``facts["summary_call"]``) as a ``chat`` span, with the
        tokens pi reported for it."""
        if not self:
            return
        step = self._child(
            "tether.checkpoint",
            {
                "tether.checkpoint.decision": result.decision.value,
                "tether.checkpoint.reason": result.why,
                "tether.checkpoint.label": result.label,
                "tether.checkpoint.receipt_reason": (
                    result.reason.value if result.reason is not None else None
                ),
                "tether.checkpoint.view_bytes": facts.get("view_bytes"),
                "tether.checkpoint.budget_bytes": facts.get("budget_bytes"),
                "tether.checkpoint.summary_bytes": facts.get("summary_bytes"),
                "tether.checkpoint.provider_ms": facts.get("provider_ms"),
                "tether.checkpoint.remaining_s": facts.get("remaining_s"),
            },
            start_ns=start_ns,
        )
        call = facts.get("summary_call")
        if isinstance(call, Mapping):
            begun, ended = call.get("start_ns"), call.get("end_ns")
            if isinstance(begun, int) and isinstance(ended, int):
                message = {"usage": call.get("usage"), "stopReason": call.get("stop")}
                self._chat(message, begun, ended, purpose="checkpoint_summary", parent=step)
        step.end()

    def ended(self, outcome: RunOutcome) -> None:
        if not self:
            return
        self.span.set(
            {
                "tether.run.status": outcome.status.value,
                "tether.run.stop_reason": outcome.stop_reason.value,
                "tether.checkpoint.decision": outcome.checkpoint.decision.value,
                "tether.checkpoint.reason": outcome.checkpoint.why,
            }
        )
        self.span.content("tether.answer", outcome.answer)
        if outcome.status is not RunStatus.FINISHED:
            self.span.fail(outcome.stop_reason.value, outcome.status.value)

    def failed(self, exc: BaseException) -> None:
        if self:
            self.span.fail(type(exc).__name__)


async def run_trace(
    ledger: Ledger,
    fence: Fence,
    run: Run,
    request: RunRequest,
    *,
    model: str,
    provider: ProviderConfig | None,
    content: bool,
    resumed: bool = False,
) -> RunTrace:
    """Open the run's ``invoke_agent`` span, a child of what the run was queued with (or, on a
    resume, of the run's own first span), and keep its context in the run's record. ``provider``
    is the agent's provider: its api (or ``otel_provider_name``) names it on the spans."""
    if telemetry.tracer() is None:
        return RunTrace()
    kept = run.extra.get(KEY)
    kept = kept if isinstance(kept, dict) else {}
    parent = kept.get("run") if resumed else kept.get("parent")
    claimed = telemetry.now_ns()
    name = genai.provider_name(provider.api, provider.otel_provider_name) if provider else None
    span = telemetry.start(
        f"invoke_agent {request.agent}",
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": request.agent,
            "gen_ai.conversation.id": run.session,
            "gen_ai.provider.name": name,
            "gen_ai.request.model": model,
            "tether.run.id": run.id,
            "tether.run.epoch": fence.epoch,
            "tether.custody.resumed": resumed,
        },
        parent=parent if isinstance(parent, str) else None,
        content=content,
        kind="internal",
    )
    span.content("tether.request", request.text)
    server = genai.server_of(provider.base_url) if provider else (None, None)
    trace = RunTrace(span, run.session, model, name, server, _content=content)
    if not resumed:
        queued = kept.get("queued_ns")
        trace.queue_wait(queued if isinstance(queued, int) else None, claimed)
        with contextlib.suppress(LedgerError):  # a trace is never worth failing a run for
            await in_thread(
                ledger.update_run_extra, fence, {KEY: {**kept, "run": span.traceparent}}
            )
    return trace


def takeover_span(run: Run, epoch: int) -> Span:
    """The lease takeover of ``run`` (custody), in the run's own trace; the caller ends it."""
    if telemetry.tracer() is None:
        return telemetry.NO_SPAN
    kept = run.extra.get(KEY)
    parent = (kept.get("run") or kept.get("parent")) if isinstance(kept, dict) else None
    return telemetry.start(
        "tether.custody.takeover",
        {
            "tether.run.id": run.id,
            "gen_ai.conversation.id": run.session,
            "tether.custody.previous_epoch": epoch,
        },
        parent=parent if isinstance(parent, str) else None,
    )
