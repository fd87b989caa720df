"""Traces with the SDK's in-memory exporter over runs of the real pi against the
scripted provider: the span tree, its names and attributes per the GenAI conventions, the
checkpoint decision for each reason it was not tried, and nothing a person or the agent wrote
(nor the provider's key) on any span unless ``[telemetry] content = true``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from checkpoint_support import AGENT, ANSWER, SUMMARY, config, long_task, run
from provider import Reply, route
from support.spans import spans
from support.wait import wait_for
from tether import telemetry
from tether.config import TelemetryConfig
from tether.harness.checkpoint import continuation_checkpoint
from tether.harness.turn import CheckpointResult, SettledTurn, decision_text
from tether.ledger import Ledger, open_ledger

__all__ = ["spans"]  # the fixture (support.spans)

pytestmark = pytest.mark.slow

SECRET = "sk-PLANTED-SECRET-9d41c2"
ROW_TEXT = "PLANTED-ROW-TEXT-77ab: count to 2000, then tell me the answer."


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Ledger]:
    ledger = open_ledger(f"sqlite://{tmp_path}/ledger.db")
    yield ledger
    ledger.close()


def by_name(found: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == prefix or s.name.startswith(prefix + " ")]


def one(found: tuple[ReadableSpan, ...], prefix: str) -> ReadableSpan:
    [span] = by_name(found, prefix)
    return span


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def keyed(cfg: Any) -> Any:
    """The config with the provider's key read from a variable holding the planted secret."""
    local = cfg.providers["local"]
    providers = {"local": msgspec.structs.replace(local, api_key_env="TETHER_TEST_PLANTED_KEY")}
    return msgspec.structs.replace(cfg, providers=providers)


def test_off_without_otel_variables_and_nothing_imported() -> None:
    assert not telemetry.wanted({})
    assert not telemetry.wanted({"OTEL_SERVICE_NAME": "x"})  # a name alone sends nothing
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert telemetry.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not telemetry.wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert not telemetry.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    )
    # A fresh interpreter that runs a span without OTEL_* variables loads no OpenTelemetry.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys; from tether import telemetry\n"
        "with telemetry.span('x') as s: s.set({'a': 1})\n"
        "assert not s and telemetry.tracer() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


EXPORT_ONE_SPAN = """
import sys
from tether import telemetry
with telemetry.span("tether.test") as s:
    s.set({"a": 1})
telemetry.flush()
print("requests" in sys.modules)
"""


def export_one_span(**otel: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter that sends one span as the ``OTEL_*`` variables ``otel`` say (and
    no others); it prints whether requests was imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", EXPORT_ONE_SPAN],
        env={**env, **otel},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_otlp_exporter_sends_on_its_urllib3_transport() -> None:
    """Configured by the variables alone, a span arrives at an OTLP/HTTP receiver, sent by the
    exporter's urllib3 transport: requests (its default's) is never imported."""
    from otlp_receiver import Receiver

    receiver = Receiver()
    receiver.start()
    try:
        done = export_one_span(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
        names = [span.name for _, span in receiver.spans()]
    finally:
        receiver.close()
    assert names == ["tether.test"], done.stderr
    assert done.stdout.strip() == "False"


SHORT_PROCESS = """
import atexit, os, sys, time
from tether import telemetry
with telemetry.span("tether.test") as s:
    s.set({"a": 1})
telemetry.flush_later()  # a run's end
time.sleep(float(sys.argv[1]))
print(sorted(m for m in sys.modules if m.startswith("opentelemetry.exporter")), flush=True)
atexit._run_exitfuncs()  # as tether's exit_now
os._exit(0)
"""


def short_process(receiver: Any, stay_s: float, **otel: str) -> subprocess.Popen[str]:
    """SHORT_PROCESS, tracing to ``receiver`` as the ``OTEL_*`` variables ``otel`` add."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.Popen(
        [sys.executable, "-c", SHORT_PROCESS, str(stay_s)],
        env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **otel},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_process_that_ends_before_its_spans_are_due_hands_them_to_a_child() -> None:
    """A ``tether run`` is over in about a second, before the spans' first export is due: it
    never loads the exporter, and its exit does not wait for the collector (which here holds
    the POST): a child sends the spans after the process is gone."""
    from otlp_receiver import Receiver

    receiver = Receiver()
    receiver.start()
    receiver.hold.clear()
    try:
        proc = short_process(receiver, 0)
        out, err = proc.communicate(timeout=60)  # its pipes close: no child holds them
        assert proc.returncode == 0, err
        assert out.strip() == "[]", "the exporter was loaded in the process"
        assert receiver.spans() == [], "the collector held the POST: nothing is kept yet"
        receiver.hold.set()
        names = wait_for(lambda: [span.name for _, span in receiver.spans()], what="the span")
    finally:
        receiver.hold.set()
        receiver.close()
    assert names == ["tether.test"]


def test_spans_due_before_the_exit_are_sent_by_the_process_itself() -> None:
    """Past ``OTEL_BSP_SCHEDULE_DELAY`` the process loads the exporter and sends what has
    ended, as the SDK's batch processor would: a process killed later has sent them."""
    from otlp_receiver import Receiver

    receiver = Receiver()
    receiver.start()
    proc = short_process(receiver, 60, OTEL_BSP_SCHEDULE_DELAY="200")
    try:
        names = wait_for(lambda: [span.name for _, span in receiver.spans()], what="the span")
        assert proc.poll() is None, "the span came from the process itself, alive"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        receiver.close()
    assert names == ["tether.test"]


def test_a_credential_provider_takes_the_exporter_s_own_default_and_a_bad_one_runs_untraced() -> (
    None
):
    """A named credential provider makes the exporter build a requests session (its default
    transport, not urllib3's); one that does not exist is the SDK's error, said on stderr, and
    the program goes on without traces."""
    done = export_one_span(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER="tether-none",
    )
    assert done.returncode == 0, done.stderr
    assert "'tether-none' not found" in done.stderr
    assert "running without traces" in done.stderr
    assert done.stdout.strip() == "True"  # the default's requests was on its way


def test_an_exporter_tether_does_not_ship_is_named_and_the_run_goes_on_untraced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    telemetry.reset()
    try:
        assert telemetry.tracer() is None
        assert not telemetry.start("x")
    finally:
        telemetry.reset()
    err = capsys.readouterr().err
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'" in err
    assert "http/protobuf" in err
    assert "running without traces" in err


def test_span_tree_of_a_run_with_a_tool_and_a_written_checkpoint(
    scripted_provider: Any,
    store: Ledger,
    tmp_path: Path,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TETHER_TEST_PLANTED_KEY", SECRET)
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    cfg = keyed(config(tmp_path, provider))
    outcome = run(store, cfg, tmp_path, text=ROW_TEXT)
    assert (outcome.checkpoint.label, outcome.answer) == ("written", ANSWER)
    found = spans.get_finished_spans()

    agent = one(found, "invoke_agent")
    assert agent.name == f"invoke_agent {AGENT}"
    assert agent.parent is None
    a = attrs(agent)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == AGENT
    assert a["gen_ai.conversation.id"] == "s1"
    assert a["gen_ai.request.model"] == provider.model
    assert a["tether.run.id"] == outcome.run
    assert a["tether.run.status"] == "finished"
    assert a["tether.checkpoint.decision"] == "written"
    assert "tether.checkpoint.reason" not in a
    assert agent.status.status_code is not StatusCode.ERROR

    trace_id = agent.context.trace_id
    assert {s.context.trace_id for s in found} == {trace_id}, "one trace for the whole run"
    step = one(found, "tether.checkpoint")
    [summary] = [c for c in by_name(found, "chat") if c.parent.span_id == step.context.span_id]
    children = {s.name.split(" ")[0] for s in found if s.parent is not None}
    others = [s for s in found if s.parent and s is not summary]
    assert all(s.parent.span_id == agent.context.span_id for s in others), children
    assert children >= {
        "chat",
        "execute_tool",
        "tether.queue.wait",
        "tether.followup.view",
        "tether.checkpoint",
    }

    # Two provider calls in the task turn: the tool call, then the answer.
    chats = [c for c in by_name(found, "chat") if c is not summary]
    assert len(chats) == 2
    for chat in chats:
        c = attrs(chat)
        assert chat.name == f"chat {provider.model}"
        assert c["gen_ai.operation.name"] == "chat"
        assert c["gen_ai.conversation.id"] == "s1"
        assert c["gen_ai.usage.input_tokens"] > 0
        assert c["gen_ai.usage.output_tokens"] > 0
        assert chat.start_time <= chat.end_time
    assert [attrs(c)["gen_ai.response.finish_reasons"] for c in chats] == [
        ("tool_call",),
        ("stop",),
    ]
    assert {attrs(c)["tether.chat.purpose"] for c in chats} == {"task"}
    # The checkpoint's summary, the run's third provider call, under the checkpoint step.
    u = attrs(summary)
    assert (u["tether.chat.purpose"], u["gen_ai.response.finish_reasons"]) == (
        "checkpoint_summary",
        ("stop",),
    )
    assert u["gen_ai.usage.input_tokens"] > 0
    assert u["gen_ai.usage.output_tokens"] > 0
    assert chats[1].end_time <= summary.start_time <= summary.end_time <= step.end_time

    tool = one(found, "execute_tool")
    t = attrs(tool)
    assert tool.name == "execute_tool bash"
    assert (t["gen_ai.tool.name"], t["gen_ai.operation.name"]) == ("bash", "execute_tool")
    assert t["gen_ai.tool.call.id"]
    assert t["tether.tool.duration_ms"] >= 0
    assert "error.type" not in t
    # The tool ran between the two provider calls.
    assert chats[0].end_time <= tool.start_time <= tool.end_time <= chats[1].end_time

    view = attrs(one(found, "tether.followup.view"))
    assert view["tether.view.follow_up"] is False  # the session's first run

    s = attrs(step)
    assert (s["tether.checkpoint.decision"], s["tether.checkpoint.label"]) == ("written", "written")
    assert s["tether.checkpoint.view_bytes"] > s["tether.checkpoint.budget_bytes"] == 4000
    assert s["tether.checkpoint.summary_bytes"] == len(SUMMARY.encode())
    assert s["tether.checkpoint.provider_ms"] >= 0
    assert "tether.checkpoint.receipt_reason" not in s

    assert store.get_run(outcome.run).extra["checkpoint_decision"] == {
        "decision": "written",
        "reason": None,
    }
    assert_no_content(found, ROW_TEXT, ANSWER)

    # The next run of the session: its view has a checkpoint and parts to show, in a new trace.
    # At 4,000 bytes its view (the summary, the anchors quoted in the room left, the copied
    # request) and its answer crossed the budget (4,028 bytes: a checkpoint written); with room
    # to spare, a checkpoint the run does not need is not tried.
    spans.clear()
    provider._pick = route(task=[Reply("SECOND ANSWER")], summary=[Reply(SUMMARY)])
    roomy = cfg.model_copy(
        update={"followup": cfg.followup.model_copy(update={"budget_bytes": 64_000})}
    )
    second = run(store, roomy, tmp_path, text="and now?")
    found = spans.get_finished_spans()
    view = attrs(one(found, "tether.followup.view"))
    assert view["tether.view.follow_up"] is True
    assert view["tether.view.checkpoint_bytes"] > 0
    assert (
        view["tether.view.bytes"]
        == (
            view["tether.view.checkpoint_bytes"]
            + view["tether.view.notice_bytes"]
            + view["tether.view.message_bytes"]
        )
        <= view["tether.view.budget_bytes"]
    )
    assert view["tether.view.gaps"] >= 0
    assert one(found, "invoke_agent").context.trace_id != trace_id
    decided = attrs(one(found, "tether.checkpoint"))
    assert (decided["tether.checkpoint.decision"], decided["tether.checkpoint.reason"]) == (
        "not_tried",
        "under_budget",
    )
    assert store.get_run(second.run).extra["checkpoint_decision"] == {
        "decision": "not_tried",
        "reason": "under_budget",
    }


def assert_no_content(found: tuple[ReadableSpan, ...], *texts: str) -> None:
    """No attribute, event or status of any span holds the planted secret or any of ``texts``."""
    planted = (SECRET, *texts)
    for span in found:
        seen = [span.name, str(span.status.description or "")]
        seen += [f"{k}={v}" for k, v in (span.attributes or {}).items()]
        for event in span.events:
            seen += [event.name, *(f"{k}={v}" for k, v in (event.attributes or {}).items())]
        for item in seen:
            for text in planted:
                assert text not in item, f"{text!r} leaked into span {span.name}: {item!r}"


def test_a_run_s_end_does_not_wait_for_the_collector(
    store: Ledger, tmp_path: Path, scripted_provider: Any
) -> None:
    """A collector that holds the export's POST unanswered: the run ends regardless (it
    starts the export and goes on), and the spans arrive once the collector answers."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    posted = threading.Event()
    answer = threading.Event()
    names: list[str] = []

    class Holding(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            posted.set()
            answer.wait(20)  # (a run that waited for this answer would see it only now)
            for res in ExportTraceServiceRequest.FromString(body).resource_spans:
                names.extend(span.name for scope in res.scope_spans for span in scope.spans)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    provider = TracerProvider(shutdown_on_exit=False)
    # The exporter waits longer than the collector holds: it never gives up on its own.
    exporter = OTLPSpanExporter(endpoint=url, timeout=60)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    telemetry.install(provider)
    try:
        llm = scripted_provider([Reply("done")])
        outcome = run(store, config(tmp_path, llm), tmp_path, text="say done")
        # The run is over while its spans' POST is still held by the collector.
        assert outcome.answer == "done"
        assert posted.wait(30), "the run's end started no export"
        assert not names
        answer.set()
        provider.force_flush(30_000)
    finally:
        answer.set()
        telemetry.reset()
        provider.shutdown()
        server.shutdown()
        server.server_close()
    assert any(name.startswith("invoke_agent") for name in names), names


def test_content_goes_on_spans_only_when_configured(
    scripted_provider: Any, store: Ledger, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    provider = scripted_provider(route(task=[Reply(ANSWER)], summary=[Reply(SUMMARY)]))
    cfg = msgspec.structs.replace(
        config(tmp_path, provider, budget=100_000), telemetry=TelemetryConfig(content=True)
    )
    run(store, cfg, tmp_path, text=ROW_TEXT)
    a = attrs(one(spans.get_finished_spans(), "invoke_agent"))
    assert (a["tether.request"], a["tether.answer"]) == (ROW_TEXT, ANSWER)


# -- the checkpoint not tried, for each reason ---------------------------------------------------


def decision(store: Ledger, found: tuple[ReadableSpan, ...], run_id: str) -> tuple[str, str]:
    s = attrs(one(found, "tether.checkpoint"))
    recorded = store.get_run(run_id).extra["checkpoint_decision"]
    assert (recorded["decision"], recorded["reason"]) == (
        s["tether.checkpoint.decision"],
        s.get("tether.checkpoint.reason"),
    ), "the span and the run's record say the same"
    a = attrs(one(found, "invoke_agent"))
    assert (a["tether.checkpoint.decision"], a["tether.checkpoint.reason"]) == (
        recorded["decision"],
        recorded["reason"],
    )
    return recorded["decision"], recorded["reason"]


def test_not_tried_under_budget(
    scripted_provider: Any, store: Ledger, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    outcome = run(store, config(tmp_path, provider, budget=100_000), tmp_path)
    assert outcome.checkpoint.label == "not_needed"
    found = spans.get_finished_spans()
    assert decision(store, found, outcome.run) == ("not_tried", "under_budget")
    s = attrs(one(found, "tether.checkpoint"))
    assert s["tether.checkpoint.view_bytes"] <= 100_000 == s["tether.checkpoint.budget_bytes"]
    assert provider.summary_requests == []


def test_not_tried_with_too_little_time_left(
    scripted_provider: Any, store: Ledger, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    cfg = config(tmp_path, provider, deadline_s=100, min_time_s=150)
    outcome = run(store, cfg, tmp_path)
    assert outcome.checkpoint.label == "refused:cancelled"  # the label as it always was
    found = spans.get_finished_spans()
    assert decision(store, found, outcome.run) == ("not_tried", "too_little_time")
    s = attrs(one(found, "tether.checkpoint"))
    assert s["tether.checkpoint.remaining_s"] < 150
    assert s["tether.checkpoint.receipt_reason"] == "cancelled"
    text = decision_text(store.get_run(outcome.run).extra)
    assert text is not None
    assert text.startswith("not tried (too little time): ")
    assert provider.summary_requests == []


def test_not_tried_with_a_stop_in_progress(
    scripted_provider: Any, store: Ledger, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))

    async def stopped_first(turn: SettledTurn) -> CheckpointResult:
        turn.stop.soft()  # a soft stop (Ctrl-C) lands as the step begins
        return await continuation_checkpoint(turn)

    outcome = run(store, config(tmp_path, provider), tmp_path, checkpoint=stopped_first)
    assert outcome.answer == ANSWER
    found = spans.get_finished_spans()
    assert decision(store, found, outcome.run) == ("not_tried", "stop_in_progress")
    assert provider.summary_requests == []


def test_not_tried_after_a_failed_turn(
    scripted_provider: Any, store: Ledger, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    from provider import Fail

    provider = scripted_provider(route(task=[Fail(400, "bad request")] * 5, summary=[]))
    outcome = run(store, config(tmp_path, provider), tmp_path)
    assert outcome.status.value == "failed"
    found = spans.get_finished_spans()
    assert decision(store, found, outcome.run) == ("not_tried", "turn_not_successful")
    agent = one(found, "invoke_agent")
    assert agent.status.status_code is StatusCode.ERROR
    assert [attrs(c).get("error.type") for c in by_name(found, "chat")] == ["provider_error"]


def test_refused_summary_names_the_receipt_reason(
    scripted_provider: Any, store: Ledger, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply("")] * 4))
    outcome = run(store, config(tmp_path, provider), tmp_path)
    assert outcome.checkpoint.label.startswith("refused:")
    reason = outcome.checkpoint.label.split(":", 1)[1]
    found = spans.get_finished_spans()
    assert decision(store, found, outcome.run) == ("refused", reason)
    s = attrs(one(found, "tether.checkpoint"))
    assert s["tether.checkpoint.receipt_reason"] == reason
    assert "tether.checkpoint.summary_bytes" not in s


def test_no_span_kind_is_left_unset(spans: InMemorySpanExporter) -> None:
    async def go() -> None:
        with telemetry.span("outer", {"a": 1}, kind="server") as outer:
            inner = telemetry.start("inner", parent=outer)
            inner.end()
            assert telemetry.trace_id_of(outer.traceparent) == outer.trace_id

    anyio.run(go)
    found = spans.get_finished_spans()
    assert [(s.name, s.kind) for s in found] == [
        ("inner", SpanKind.INTERNAL),
        ("outer", SpanKind.SERVER),
    ]
    assert found[0].parent is not None
    assert found[0].parent.span_id == found[1].context.span_id
    assert telemetry.trace_id_of("00-" + "0" * 32 + "-" + "1" * 16 + "-01") is None
    assert telemetry.trace_id_of("garbage") is None
