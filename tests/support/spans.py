"""The ``spans`` fixture: tether's telemetry installed with an in-memory exporter for the
test, reset after it. A module that uses it imports it (``from support.spans import spans``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tether import telemetry

__all__ = ["spans"]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans the test's code ends, kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install(provider)
    yield exporter
    telemetry.reset()
    provider.shutdown()
