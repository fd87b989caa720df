"""Traces as an operator gets them (DESIGN §3.14): ``tether serve`` with a worker, configured by
the standard ``OTEL_*`` variables only, exports over OTLP/HTTP to a receiver this test starts on
127.0.0.1; what arrives is decoded with the protobuf classes that ship with the exporter. A
request's ``traceparent`` continues into the worker and the run, ``POST …/requests`` answers
with the trace id, and no request text, answer or provider key is in any byte sent."""

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

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from checkpoint_support import ANSWER as COUNTED
from checkpoint_support import SUMMARY, long_task
from otlp_receiver import Receiver, attrs
from provider import Reply, ScriptedProvider, ToolCall, route
from service_support import serve, write_config

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
    # the run on the same pi (DESIGN §3.7). Both processes trace, as the OTEL_* variables say.
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY, delay_s=3)]))
    (tmp_path / "work").mkdir()
    config = tmp_path / "tether.toml"
    config.write_text(
        f"""
[ledger]
url = "sqlite://{tmp_path}/ledger.db"
[followup]
budget_bytes = 4000
[providers.local]
base_url = "{provider.url}"
context_window = 64000
max_tokens = 2048
[agents.rev]
provider = "local"
model = "{provider.model}"
tools = ["bash"]
deadline_s = 120
checkpoint_min_time_s = 0
workdir = "{tmp_path}/work"
[harness]
runs_dir = "{tmp_path}/runs"
pi_settings = {{ retry = {{ maxRetries = 2, baseDelayMs = 10 }} }}
"""
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
