"""Traces as an operator gets them (DESIGN §3.14): ``tether serve`` with a worker, configured by
the standard ``OTEL_*`` variables only, exports over OTLP/HTTP to a receiver this test starts on
127.0.0.1; what arrives is decoded with the protobuf classes that ship with the exporter. A
request's ``traceparent`` continues into the worker and the run, ``POST …/requests`` answers
with the trace id, and no request text, answer or provider key is in any byte sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from provider import Reply, ScriptedProvider, ToolCall
from service_support import serve, write_config

pytestmark = pytest.mark.slow

ROW_TEXT = "PLANTED-ROW-TEXT-3f9e: list the files, then say what you saw."
ANSWER = "PLANTED-ANSWER-c1d8: two files."
SECRET = "sk-PLANTED-SECRET-51aa"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP trace receiver: keeps every body POSTed to /v1/traces."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
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
                res = {a.key: _value(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    out += [(res, span) for span in scope.spans]
        return out


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def attrs(span: Span) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


def wait_for(predicate: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError("not seen in time")
        time.sleep(0.05)
    return got


def test_a_service_request_traceparent_continues_through_the_worker_and_the_run(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], receiver: Receiver
) -> None:
    p = scripted_provider([Reply(tool_calls=[ToolCall("bash", {"command": "ls"})]), Reply(ANSWER)])
    config = write_config(tmp_path, p.url)
    # The provider's key, read from a variable: it must reach pi and no span.
    text = config.read_text().replace(
        "context_window = 8192", 'context_window = 8192\napi_key_env = "PLANTED_KEY"'
    )
    text = text.replace("deadline_s = 60", 'deadline_s = 60\ntools = ["bash"]')
    config.write_text(text)
    (tmp_path / "work").mkdir(exist_ok=True)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "tether-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "PLANTED_KEY": SECRET,
    }
    with serve(tmp_path, config, workers=1, env=env) as s:
        posted = s.client.post(
            "/v1/sessions/s1/requests",
            json={"agent": "rev", "text": ROW_TEXT},
            headers={
                "Authorization": "Bearer ana-token",
                "traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01",
            },
        )
        assert posted.status_code == 202, posted.text
        assert posted.json()["trace_id"] == TRACE_ID
        run = s.wait_run(posted.json()["run"])
        assert run["status"] == "finished", run
        assert run["answer"] == ANSWER

        def complete() -> list[tuple[dict[str, Any], Span]]:
            got = receiver.spans()
            names = {span.name.split(" ")[0] for _, span in got}
            return got if {"POST", "invoke_agent", "chat", "execute_tool"} <= names else []

        found = wait_for(complete)
        # A request that does not send a traceparent starts a trace of its own.
        fresh = s.post("s2", "hello")
        assert fresh.status_code == 202
        assert fresh.json()["trace_id"] not in (None, TRACE_ID)
        assert len(fresh.json()["trace_id"]) == 32

    assert set(receiver.paths) == {"/v1/traces"}
    assert {res.get("service.name") for res, _ in found} == {"tether-under-test"}
    mine = [span for _, span in found if span.trace_id.hex() == TRACE_ID]
    [post] = [sp for sp in mine if sp.name.startswith("POST ")]
    assert post.parent_span_id.hex() == PARENT_SPAN
    assert post.kind == Span.SPAN_KIND_SERVER
    assert attrs(post)["gen_ai.conversation.id"] == "s1"
    assert attrs(post)["tether.run.id"] == run["run"]

    [agent] = [sp for sp in mine if sp.name == "invoke_agent rev"]
    assert agent.parent_span_id == post.span_id, "the worker's run continues the request"
    a = attrs(agent)
    assert (a["gen_ai.conversation.id"], a["gen_ai.agent.name"]) == ("s1", "rev")
    assert a["tether.run.id"] == run["run"]
    # The worker's runs carry the checkpoint step; this small view is under the budget.
    assert (a["tether.checkpoint.decision"], a["tether.checkpoint.reason"]) == (
        "not_tried",
        "under_budget",
    )

    chats = [sp for sp in mine if sp.name.startswith("chat")]
    assert len(chats) == 2
    assert {c.parent_span_id for c in chats} == {agent.span_id}
    assert all(attrs(c)["gen_ai.usage.output_tokens"] > 0 for c in chats)
    [tool] = [sp for sp in mine if sp.name == "execute_tool bash"]
    assert tool.parent_span_id == agent.span_id
    assert attrs(tool)["gen_ai.tool.name"] == "bash"
    wait = [sp for sp in mine if sp.name == "tether.queue.wait"]
    assert [w.parent_span_id for w in wait] == [agent.span_id]

    # No byte sent holds the request's text, the answer or the provider's key.
    for body in receiver.bodies:
        for planted in (ROW_TEXT, ANSWER, SECRET):
            assert planted.encode() not in body
