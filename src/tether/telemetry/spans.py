"""Spans as tether uses them: a handle that is a no-op when tracing is off, W3C trace
context in and out (``traceparent``), and the content rule (no row text, prompt, answer or
secret becomes an attribute unless ``[telemetry] content = true``).

Parents are passed explicitly (a :class:`Span` or a ``traceparent`` string), not taken from
the ambient context: a run's spans are made by several tasks (pi's events are followed in a
task of their own) and some after the fact, with the times pi's events carried.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tether.telemetry import setup

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = [
    "NO_SPAN",
    "Attr",
    "Span",
    "now_ns",
    "span",
    "start",
    "trace_id_of",
]

Attr = str | bool | int | float | tuple[str, ...]
"""An attribute's value: one, or a list of strings (``gen_ai.response.finish_reasons``)."""


def now_ns() -> int:
    return time.time_ns()


class Span:
    """One span, or nothing (``NO_SPAN``) when tracing is off: every method is then a no-op,
    so callers never ask whether tracing is on."""

    __slots__ = ("_content", "_span")

    def __init__(self, otel_span: Any = None, *, content: bool = False) -> None:
        self._span = otel_span
        self._content = content

    def __bool__(self) -> bool:
        return self._span is not None

    def set(self, attrs: Mapping[str, Attr | None]) -> None:
        """Set attributes (None values are left out)."""
        if self._span is not None:
            self._span.set_attributes({k: v for k, v in attrs.items() if v is not None})

    def content(self, key: str, value: str | None) -> None:
        """An attribute that may hold what a person or the agent wrote (a prompt, an answer,
        a tool's arguments): set only when the run's ``[telemetry] content`` is true."""
        if self._span is not None and self._content and value is not None:
            self._span.set_attribute(key, value)

    def event(self, name: str, attrs: Mapping[str, Attr | None] | None = None) -> None:
        if self._span is not None:
            self._span.add_event(name, {k: v for k, v in (attrs or {}).items() if v is not None})

    def fail(self, error_type: str, description: str | None = None) -> None:
        """Mark the span failed (``error.type``, the span's status); ``description`` is
        tether's own wording, never a row's text."""
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_attribute("error.type", error_type)
            self._span.set_status(Status(StatusCode.ERROR, description))

    def end(self, end_ns: int | None = None) -> None:
        if self._span is not None:
            self._span.end(end_time=end_ns)

    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` of this span (to store with a run, or send on)."""
        if self._span is None:
            return None
        ctx = self._span.get_span_context()
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    @property
    def trace_id(self) -> str | None:
        if self._span is None:
            return None
        ctx = self._span.get_span_context()
        return f"{ctx.trace_id:032x}" if ctx.is_valid else None

    @property
    def content_allowed(self) -> bool:
        return self._content


NO_SPAN = Span()


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id a ``traceparent`` names (None when it is not a valid one)."""
    if not traceparent:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1]


def _context(parent: Span | str | None) -> Context | None:
    if isinstance(parent, Span):
        if parent._span is None:
            return None
        from opentelemetry.trace import set_span_in_context

        return set_span_in_context(parent._span)
    if isinstance(parent, str) and parent:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        return TraceContextTextMapPropagator().extract({"traceparent": parent})
    return None


def start(
    name: str,
    attrs: Mapping[str, Attr | None] | None = None,
    *,
    parent: Span | str | None = None,
    start_ns: int | None = None,
    content: bool | None = None,
    kind: str = "internal",
) -> Span:
    """Start a span (``NO_SPAN`` when tracing is off); the caller ends it. ``content``
    defaults to the parent's (a run's spans follow the run's ``[telemetry] content``)."""
    tracer = setup.tracer()
    if tracer is None:
        return NO_SPAN
    from opentelemetry.trace import SpanKind

    if content is None:
        content = isinstance(parent, Span) and parent._content
    otel = tracer.start_span(
        name,
        context=_context(parent),
        kind=SpanKind[kind.upper()],
        attributes={k: v for k, v in (attrs or {}).items() if v is not None},
        start_time=start_ns,
    )
    return Span(otel, content=content)


@contextlib.contextmanager
def span(
    name: str,
    attrs: Mapping[str, Attr | None] | None = None,
    *,
    parent: Span | str | None = None,
    content: bool | None = None,
    kind: str = "internal",
) -> Iterator[Span]:
    """A span around a block; an exception leaving it marks it failed with its type."""
    opened = start(name, attrs, parent=parent, content=content, kind=kind)
    try:
        yield opened
    except BaseException as exc:
        if opened:
            opened.fail(type(exc).__name__)
        raise
    finally:
        opened.end()
