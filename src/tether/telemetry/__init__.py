"""Traces of runs, tools and checkpoint decisions, optional (``tether[otel]``).

Off unless the standard ``OTEL_*`` variables name somewhere to send spans; off, nothing of
OpenTelemetry is imported and every call returns at once. :mod:`.setup` decides and holds the
tracer provider; :mod:`.spans` is what the harness, the service and the CLI call;
:mod:`.genai` has the GenAI semantic conventions' values (provider names, finish reasons).
"""

from tether.telemetry.setup import flush, flush_later, install, reset, tracer, wanted
from tether.telemetry.spans import (
    NO_SPAN,
    Attr,
    Span,
    now_ns,
    span,
    start,
    trace_id_of,
)

__all__ = [
    "NO_SPAN",
    "Attr",
    "Span",
    "flush",
    "flush_later",
    "install",
    "now_ns",
    "reset",
    "span",
    "start",
    "trace_id_of",
    "tracer",
    "wanted",
]
