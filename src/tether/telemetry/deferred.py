"""The span processor of a process that traces from the ``OTEL_*`` variables: it holds ended
spans and loads the exporter only when they are due, so that a short ``tether run`` never loads
it at all.

Importing the OTLP exporter (protobuf, its message classes, an HTTP client) and encoding and
posting the spans cost a ``tether run`` about 50 ms of CPU and the wait for the collector's answer
at its exit, on top of a run of about a second. Here:

- ended spans are held; the first one starts a timer of ``OTEL_BSP_SCHEDULE_DELAY`` (5 s by
  default, as the SDK's batch processor would wait before its first export). When it fires, the
  exporter is loaded and a :class:`BatchSpanProcessor` takes the held spans and every later one:
  a long run, or ``tether serve``, exports as the SDK's batch processor does, so a process killed
  mid-run has sent what ended before its last schedule;
- a process that ends before that (the usual ``tether run``) hands what it holds to a child it
  forks at its exit (the provider's shutdown, run by the exit handlers), which loads the exporter,
  sends the spans and exits on its own: the command returns without waiting for the collector.
  The child has its own session and ``/dev/null`` for its standard streams (stderr is kept when
  it is a terminal, for the exporter's warnings), so nothing waiting on the command's pipes waits
  for it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import Span

__all__ = ["DeferredExport"]

_DEFAULT_DELAY_S = 5.0
_LOADING_WAIT_S = 30.0


def _schedule_delay_s() -> float:
    raw = os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "")
    try:
        return max(float(raw) / 1000, 0.0) if raw.strip() else _DEFAULT_DELAY_S
    except ValueError:
        return _DEFAULT_DELAY_S


class DeferredExport(SpanProcessor):
    """Holds ended spans until they are due (see the module's docstring); ``exporters`` builds
    the exporters, called in this process once they are due, or in the child at exit (they
    read the ``OTEL_*`` variables then, as a process's environment has them all along)."""

    def __init__(self, exporters: Callable[[], list[Any]]) -> None:
        self._exporters = exporters
        self._lock = threading.Lock()
        self._held: list[ReadableSpan] = []
        self._batch: list[SpanProcessor] | None = None
        self._timer: threading.Timer | None = None
        self._shut = False

    @property
    def exporting(self) -> bool:
        """Whether this process has loaded its exporters (the spans were due)."""
        return self._batch is not None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            batch = self._batch
            if batch is None and not self._shut:
                self._held.append(span)
                if self._timer is None:
                    self._timer = threading.Timer(_schedule_delay_s(), self._due)
                    self._timer.daemon = True
                    self._timer.name = "tether-otel-due"
                    self._timer.start()
                return
        for processor in batch or ():
            processor.on_end(span)

    def _due(self) -> list[SpanProcessor]:
        """Load the exporters and pass them what is held (once). They are loaded outside the
        lock: a span ending meanwhile is held, not kept waiting for an import."""
        with self._lock:
            if self._batch is not None:
                return self._batch
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        batch: list[SpanProcessor] = [BatchSpanProcessor(e) for e in self._exporters()]
        with self._lock:
            if self._batch is not None:  # another thread was first
                won = self._batch
            else:
                won, self._batch = None, batch
                held, self._held = self._held, []
        if won is not None:
            for processor in batch:
                processor.shutdown()
            return won
        for span in held:
            for processor in batch:
                processor.on_end(span)
        return batch

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send everything now (loads the exporters in this process)."""
        return all(p.force_flush(timeout_millis) for p in self._due())

    def shutdown(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
            timer = self._timer
        if timer is not None:
            timer.cancel()
            if timer.is_alive():
                # The exporters are being loaded: a fork now could leave the child waiting
                # forever on a module lock that thread holds. Let it finish, then flush here.
                timer.join(_LOADING_WAIT_S)
        with self._lock:
            batch, held, self._held = self._batch, self._held, []
        if batch is not None:
            for span in held:
                for processor in batch:
                    processor.on_end(span)
            for processor in batch:
                processor.shutdown()
        elif held:
            self._hand_off(held)

    def _hand_off(self, spans: list[ReadableSpan]) -> None:
        """Fork a child that sends ``spans`` and exits (where it cannot be forked, they are
        sent here)."""
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns of forking a process with threads: the child runs only
                # this function's code and ends with os._exit.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            self._send(spans)
            return
        if pid:
            return
        status = 0
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            keep_stderr = False
            with contextlib.suppress(OSError, ValueError):
                keep_stderr = sys.stderr.isatty()
            for fd in (0, 1) if keep_stderr else (0, 1, 2):
                os.dup2(null, fd)
            self._send(spans)
        except BaseException:
            status = 1
        finally:
            os._exit(status)

    def _send(self, spans: list[ReadableSpan]) -> None:
        for exporter in self._exporters():
            try:
                exporter.export(spans)
            finally:
                exporter.shutdown()
