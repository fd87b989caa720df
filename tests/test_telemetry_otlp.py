"""Traces as an operator gets them: ``tether serve`` with a worker, configured by the standard
``OTEL_*`` variables only, exports over OTLP/HTTP to a receiver this test starts on 127.0.0.1;
what arrives is decoded with the protobuf classes that ship with the exporter. A request's
``traceparent`` continues into the worker and the run, ``POST …/requests`` answers with the
trace id, and no request text, answer or provider key is in any byte sent. The spans' names,
kinds and values are those of OpenTelemetry's published semantic conventions (their PyPI
package's constants)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_TOOL_NAME,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GenAiOperationNameValues,
    GenAiProviderNameValues,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE,
    HTTP_ROUTE,
)
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT

from checkpoint_support import ANSWER as COUNTED
from checkpoint_support import SUMMARY, long_task
from otlp_receiver import Receiver, attrs
from provider import Reply, ScriptedProvider, ToolCall, route
from service_support import serve, write_config
from support import config as test_config

pytestmark = pytest.mark.slow

ROW_TEXT = "PLANTED-ROW-TEXT-3f9e: list the files, then say what you saw."
ANSWER = "PLANTED-ANSWER-c1d8: two files."
SECRET = "sk-PLANTED-SECRET-51aa"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    found.start()
    yield found
    found.close()


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
        fresh = s.post("s2", "hello", request_id="k2")
        assert fresh.status_code == 202
        assert fresh.json()["trace_id"] not in (None, TRACE_ID)
        assert len(fresh.json()["trace_id"]) == 32
        # Repeated (same request_id), it names the same run and that run's trace.
        again = s.post("s2", "hello", request_id="k2")
        assert (again.json()["run"], again.json()["trace_id"]) == (
            fresh.json()["run"],
            fresh.json()["trace_id"],
        )

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


def test_a_run_resumed_by_tether_recover_joins_the_runs_trace(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], receiver: Receiver
) -> None:
    # A slow summary: the harness is killed while pi writes it, and `tether recover` resumes
    # the run on the same pi. Both processes trace, as the OTEL_* variables say.
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY, delay_s=3)]))
    config = test_config.write_config(
        tmp_path,
        provider.url,
        followup={"budget_bytes": 4000},
        providers={"local": {"context_window": 64000, "max_tokens": 2048}},
        agents={
            "rev": {
                "model": provider.model,
                "tools": ["bash"],
                "deadline_s": 120,
                "checkpoint_min_time_s": 0,
            }
        },
        harness={"pi_settings": {"retry": {"maxRetries": 2, "baseDelayMs": 10}}},
    )
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    argv = [sys.executable, "-m", "tether"]
    proc = subprocess.Popen(
        [*argv, "run", "--config", str(config), "-s", "s1", "-a", "rev", "--json", "count"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: provider.summary_requests or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, "tether run ended before its checkpoint"
        # What the first harness ended before it died (the task turn's spans) was sent.
        first = wait_for(lambda: [sp for _, sp in receiver.spans() if sp.name.startswith("chat")])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    recovered = subprocess.run(
        [*argv, "recover", "--config", str(config), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert recovered.returncode == 0, recovered.stderr
    [item] = [json.loads(line) for line in recovered.stdout.splitlines()]
    assert item["resolution"] == "resumed", item
    assert (item["outcome"]["answer"], item["outcome"]["checkpoint"]) == (COUNTED, "written")

    original = first[0].parent_span_id  # the first harness's invoke_agent (never ended)
    trace = first[0].trace_id
    found = wait_for(
        lambda: (
            [
                sp
                for _, sp in receiver.spans()
                if sp.name in ("invoke_agent rev", "tether.custody.takeover")
            ]
            if len([sp for _, sp in receiver.spans() if sp.name == "invoke_agent rev"]) >= 1
            else []
        )
    )
    [resumed] = [sp for sp in found if sp.name == "invoke_agent rev"]
    [takeover] = [sp for sp in found if sp.name == "tether.custody.takeover"]
    assert resumed.trace_id == takeover.trace_id == trace, "one trace across both harnesses"
    assert resumed.parent_span_id == takeover.parent_span_id == original
    assert attrs(resumed)["tether.custody.resumed"] is True
    assert attrs(takeover)["tether.custody.resolution"] == "resumed"
    assert (attrs(resumed)["tether.checkpoint.decision"], attrs(resumed)["tether.run.status"]) == (
        "written",
        "finished",
    )


SUMMARY_TOKENS = (3210, 87)
"""The summary call's (prompt, completion) tokens, as the scripted provider reports them."""


def served_config(tmp_path: Path, url: str) -> Path:
    """The service's config (tests/service_support.py) with the bash tool and a follow-up budget
    (4 KB) that a long task turn ends over: its run writes a continuation checkpoint."""
    config = write_config(tmp_path, url)
    text = config.read_text().replace("context_window = 8192", "context_window = 64000")
    text = text.replace(
        "deadline_s = 60", 'deadline_s = 60\ntools = ["bash"]\ncheckpoint_min_time_s = 0'
    )
    config.write_text(text + "\n[followup]\nbudget_bytes = 4000\n")
    (tmp_path / "work").mkdir(exist_ok=True)
    return config


def test_a_served_run_s_spans_follow_the_genai_conventions(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], receiver: Receiver
) -> None:
    """A run with a tool call and a written checkpoint, as its worker exports it: the provider
    is named by its api's well-known value (an OpenAI-compatible server: ``openai``, the
    server's address beside it), finish reasons are the conventions' list, model calls are
    CLIENT spans, the agent and its tools INTERNAL ones, and the summary's call is a ``chat``
    span with the tokens the provider reported for it."""
    provider = scripted_provider(
        route(task=long_task(), summary=[Reply(SUMMARY, usage=SUMMARY_TOKENS)])
    )
    config = served_config(tmp_path, provider.url)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with serve(tmp_path, config, workers=1, env=env) as s:
        posted = s.post("s1", "count to 2000")
        assert posted.status_code == 202, posted.text
        run = s.wait_run(posted.json()["run"])
        assert (run["status"], run["answer"]) == ("finished", COUNTED)
        trace = posted.json()["trace_id"]

        def complete() -> list[Span]:
            got = [sp for _, sp in receiver.spans() if sp.trace_id.hex() == trace]
            names = [sp.name.split(" ")[0] for sp in got]
            return got if names.count("chat") == 3 and "invoke_agent" in names else []

        found = wait_for(complete)

    openai = GenAiProviderNameValues.OPENAI.value
    [post] = [sp for sp in found if sp.name.startswith("POST ")]
    assert post.kind == Span.SPAN_KIND_SERVER
    assert attrs(post)[HTTP_RESPONSE_STATUS_CODE] == 202
    assert post.status.code == Status.STATUS_CODE_UNSET

    [agent] = [sp for sp in found if sp.name == "invoke_agent rev"]
    a = attrs(agent)
    assert agent.kind == Span.SPAN_KIND_INTERNAL, "an agent tether runs itself"
    assert a[GEN_AI_OPERATION_NAME] == GenAiOperationNameValues.INVOKE_AGENT.value
    assert a[GEN_AI_PROVIDER_NAME] == openai, "the api's provider, not the section's name"
    assert a["tether.checkpoint.decision"] == "written"

    [step] = [sp for sp in found if sp.name == "tether.checkpoint"]
    chats = [sp for sp in found if sp.name == f"chat {provider.model}"]
    task = sorted(
        (c for c in chats if c.parent_span_id == agent.span_id),
        key=lambda c: c.start_time_unix_nano,
    )
    [summary] = [c for c in chats if c.parent_span_id == step.span_id]
    assert len(task) == 2
    port = urlsplit(provider.url).port
    for chat in [*task, summary]:
        c = attrs(chat)
        assert chat.kind == Span.SPAN_KIND_CLIENT
        assert c[GEN_AI_OPERATION_NAME] == GenAiOperationNameValues.CHAT.value
        assert c[GEN_AI_PROVIDER_NAME] == openai
        assert (c[SERVER_ADDRESS], c[SERVER_PORT]) == ("127.0.0.1", port)
        assert ERROR_TYPE not in c
    assert [attrs(c)[GEN_AI_RESPONSE_FINISH_REASONS] for c in task] == [["tool_call"], ["stop"]]

    u = attrs(summary)
    assert u[GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert (u[GEN_AI_USAGE_INPUT_TOKENS], u[GEN_AI_USAGE_OUTPUT_TOKENS]) == SUMMARY_TOKENS
    assert u["tether.chat.purpose"] == "checkpoint_summary"
    assert task[1].end_time_unix_nano <= summary.start_time_unix_nano <= step.end_time_unix_nano

    [tool] = [sp for sp in found if sp.name == "execute_tool bash"]
    assert tool.kind == Span.SPAN_KIND_INTERNAL
    assert attrs(tool)[GEN_AI_OPERATION_NAME] == GenAiOperationNameValues.EXECUTE_TOOL.value
    assert attrs(tool)[GEN_AI_TOOL_NAME] == "bash"


def test_a_request_answered_409_is_no_error_on_its_server_span(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A request the service refuses with 409 (its request_id was used for another request):
    its server span says so in ``http.response.status_code`` and is not an error, since a
    server's 4xx is its client's error."""
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with serve(tmp_path, config, workers=0, env=env) as s:
        assert s.post("s1", "hello", request_id="k1").status_code == 202
        refused = s.post("s1", "another request", request_id="k1")
        assert refused.status_code == 409, refused.text

        def both() -> list[Span]:
            got = sorted((sp for _, sp in receiver.spans()), key=lambda sp: sp.start_time_unix_nano)
            return got if len(got) >= 2 else []

        found = wait_for(both)

    route_ = "/v1/sessions/{session}/requests"
    assert [sp.name for sp in found] == [f"POST {route_}"] * 2
    for sp in found:
        assert sp.kind == Span.SPAN_KIND_SERVER
        assert (attrs(sp)[HTTP_REQUEST_METHOD], attrs(sp)[HTTP_ROUTE]) == ("POST", route_)
    got = [(attrs(sp).get(HTTP_RESPONSE_STATUS_CODE), sp.status.code) for sp in found]
    assert got == [(202, Status.STATUS_CODE_UNSET), (409, Status.STATUS_CODE_UNSET)]
    assert all(ERROR_TYPE not in attrs(sp) for sp in found)
