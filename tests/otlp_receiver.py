"""An OTLP/HTTP trace receiver on 127.0.0.1 for the telemetry tests: it keeps every body
POSTed to it and decodes them with the protobuf classes that ship with the exporter."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class Receiver:
    """An OTLP/HTTP trace receiver: keeps every body POSTed to /v1/traces."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.hold = threading.Event()
        """Cleared, every POST waits (unanswered, unkept) until it is set again."""
        self.hold.set()
        self.paths: list[str] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.hold.wait(60)
                with lock:
                    outer.paths.append(self.path)
                    outer.bodies.append(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every span received, with its resource's attributes."""
        out = []
        for body in list(self.bodies):
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                res = {a.key: value_of(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    out += [(res, span) for span in scope.spans]
        return out

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def value_of(value: Any) -> Any:
    """An attribute's value; a list one (``array_value``) as a list of its values."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attrs(span: Span) -> dict[str, Any]:
    return {a.key: value_of(a.value) for a in span.attributes}
