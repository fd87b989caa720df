"""Whether runs are traced, and the tracer provider when they are.

Tracing is on when the standard variables name somewhere to send spans
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or
``OTEL_TRACES_EXPORTER`` other than ``none``) and ``OTEL_SDK_DISABLED`` is not ``true``. Off,
nothing of OpenTelemetry is imported: every call of :mod:`tether.telemetry.spans` returns at
once. The SDK reads the rest of the standard variables itself (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_EXPORTER_OTLP_HEADERS``, …).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from tether.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from tether.telemetry.deferred import DeferredExport

__all__ = ["flush", "flush_later", "install", "reset", "tracer", "wanted"]

_EXPORT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_CREDENTIAL_PROVIDER_VARS = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
)
SCOPE = "tether"
"""The instrumentation scope every span of tether carries."""

_lock = threading.Lock()
_state: dict[str, Any] = {"decided": False, "provider": None, "tracer": None, "deferred": None}


def wanted(environ: dict[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (cheap: reads variables only)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter) or any(env.get(name) for name in _EXPORT_VARS)


def _exporter_names(names: str) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (otlp unless set), checked now, before any
    is loaded: what tether cannot send to is refused at the start, not when spans are due."""
    out = [n.strip().lower() for n in names.split(",") if n.strip()] or ["otlp"]
    for name in out:
        if name == "otlp":
            # The HTTP exporter ships with tether[otel]; an OTEL_EXPORTER_OTLP_PROTOCOL of grpc
            # would need another package, so it is refused rather than ignored.
            protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol.strip() != "http/protobuf":
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: tether sends traces over "
                    "OTLP/HTTP only; set it to http/protobuf (or unset it) and point "
                    "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318)"
                )
        elif name != "console":
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={name!r} is not one tether can send to; use otlp, "
                "console or none"
            )
    return out


def _exporters(names: list[str]) -> list[Any]:
    out: list[Any] = []
    for name in names:
        if name == "otlp":
            out.append(_otlp_exporter())
        else:
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out.append(ConsoleSpanExporter())
    return out


def _otlp_exporter() -> Any:
    """The OTLP/HTTP exporter, configured by the standard variables, on its own urllib3
    transport rather than its default requests one: requests and what it imports
    (charset_normalizer, idna, http.cookiejar) add about 17 ms of CPU to every traced
    ``tether run``'s start, for a POST to a collector. The default is kept where a credential
    provider (a requests session) is named, or where this exporter has no such transport."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    env = os.environ
    if any(env.get(name) for name in _CREDENTIAL_PROVIDER_VARS):
        return OTLPSpanExporter()
    try:
        from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
    except ImportError:
        return OTLPSpanExporter()
    # What the exporter's own _build_transport reads, in the same order.
    verify: bool | str = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
        or env.get("OTEL_EXPORTER_OTLP_CERTIFICATE")
        or True
    )
    key = env.get("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY") or env.get(
        "OTEL_EXPORTER_OTLP_CLIENT_KEY"
    )
    cert = env.get("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE") or env.get(
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
    )
    transport = Urllib3HTTPTransport(verify=verify, cert=(cert, key) if cert and key else cert)
    try:
        return OTLPSpanExporter(_transport=transport)
    except TypeError:  # an exporter that takes no transport
        transport.close()
        return OTLPSpanExporter()


def _build() -> tuple[TracerProvider, DeferredExport | None] | None:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        # Asked for, but the extra is not installed: say so once, on stderr, and run untraced.
        print(
            "tether: OTEL_* variables ask for traces but the otel extra is not installed "
            "(pip install 'tether[otel]'); running without traces",
            file=sys.stderr,
        )
        return None
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; "tether" unless set.
    attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "tether"}
    provider = TracerProvider(resource=Resource.create(attrs))
    names = _exporter_names(os.environ.get("OTEL_TRACES_EXPORTER", ""))
    if "console" in names or any(os.environ.get(name) for name in _CREDENTIAL_PROVIDER_VARS):
        # Console output belongs before the command's exit, and a credential provider is
        # checked by building the exporter: both are loaded now.
        for exporter in _exporters(names):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return provider, None
    from tether.telemetry.deferred import DeferredExport

    deferred = DeferredExport(lambda: _exporters(names))
    provider.add_span_processor(deferred)
    return provider, deferred


def tracer() -> Tracer | None:
    """The tracer of this process, None when tracing is off (decided once, on first use)."""
    if _state["decided"]:
        return _state["tracer"]  # type: ignore[no-any-return]
    with _lock:
        if not _state["decided"]:
            try:
                built = _build() if wanted() else None
            except ConfigError as exc:
                # Traces are never worth a run: say what is wrong and run without them.
                print(f"tether: {exc}; running without traces", file=sys.stderr)
                built = None
            except Exception as exc:  # the SDK's own refusal of what the variables say
                print(
                    f"tether: OpenTelemetry could not be set up from the OTEL_* variables "
                    f"({type(exc).__name__}: {exc}); running without traces",
                    file=sys.stderr,
                )
                built = None
            _set(*(built or (None, None)))
    return _state["tracer"]  # type: ignore[no-any-return]


def _set(provider: TracerProvider | None, deferred: DeferredExport | None = None) -> None:
    _state["deferred"] = deferred
    _state["provider"] = provider
    _state["tracer"] = provider.get_tracer(SCOPE) if provider is not None else None
    _state["decided"] = True


def install(provider: TracerProvider | None) -> None:
    """Use ``provider`` from now on, whatever the environment says (tests, embedding
    programs); None turns tracing off."""
    with _lock:
        _set(provider)


def reset() -> None:
    """Forget the decision: the next span reads the environment again."""
    with _lock:
        _state.update(decided=False, provider=None, tracer=None, deferred=None)


def flush_later() -> None:
    """Start sending what is buffered, and return at once: the end of a run. A run never waits
    for the collector (one that is slow or down would hold every run's end for the exporter's
    timeout, 10 s by default). Spans not yet due are left to :class:`DeferredExport`: a
    process that exits first hands them to a child at its exit (the SDK's exit handler shuts
    the provider down; ``tether`` runs exit handlers too)."""
    provider = _state["provider"]
    deferred = _state["deferred"]
    if deferred is not None and not deferred.exporting:
        return  # not due yet: sent when they are, or by the child the exit forks
    if provider is not None:
        threading.Thread(target=provider.force_flush, daemon=True, name="tether-otel-flush").start()


def flush(timeout_s: float = 5.0) -> None:
    """Send what is buffered (the end of a run; ``tether`` exits without the interpreter's
    teardown, which would otherwise drop it)."""
    provider = _state["provider"]
    if provider is not None:
        provider.force_flush(int(timeout_s * 1000))
