"""The service over real HTTP on 127.0.0.1: `tether serve` (uvicorn) with in-process workers,
the real pi, the scripted provider (docs/contracts.md#the-http-api)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from provider import RecordedRequest, Reply, ScriptedProvider, ToolCall, route
from service_support import (
    auth,
    serve,
    sse_events,
    stop_proc,
    tether_proc,
    wait_until,
    write_config,
)
from test_cli_entry import PROBE
from tether.ledger import NewRow, RowKind, RunStatus, open_ledger
from tether.service.app import STOPPING

Provider = Callable[..., ScriptedProvider]


def test_a_request_is_answered_end_to_end(tmp_path: Path, scripted_provider: Provider) -> None:
    p = scripted_provider([Reply("the answer")])
    with serve(tmp_path, write_config(tmp_path, p.url)) as s:
        posted = s.post("s1", "review it", request_id="k1")
        assert posted.status_code == 202, posted.text
        body = posted.json()
        assert body["status"] == "queued"
        assert body["request_id"] == "k1"
        run = s.wait_run(body["run"])
        assert run["status"] == "finished", run
        assert run["answer"] == "the answer"
        assert run["actor"] == "user:ana"
        assert run["session"] == "s1"
        assert run["agent"] == "rev"
        assert run["checkpoint"] == "not_needed"
        rows = s.get("/v1/sessions/s1/rows", after=0).json()
        roles = [(r["actor"], r["message"]["role"]) for r in rows["rows"]]
        assert roles[0] == ("user:ana", "user")
        assert roles[-1] == ("agent:rev", "assistant")
        assert rows["rows"][0]["message"]["content"][0]["text"] == "review it"
        assert rows["withheld"] == []
        assert s.get("/v1/sessions").json()["sessions"][0]["session"] == "s1"
        context = s.get("/v1/sessions/s1/context", agent="rev").json()
        assert context["status"] == "ok"
        assert context["previous_request"]["actor"] == "user:ana"
        metrics = s.client.get("/metrics").text
        assert 'tether_runs{status="finished"} 1' in metrics
        assert 'tether_checkpoints_total{outcome="not_needed"} 1' in metrics
        assert "tether_http_request_seconds_bucket" in metrics
        assert s.client.get("/openapi.json").json()["paths"]["/v1/sessions/{session}/requests"]
    assert [r.last_user_text for r in p.task_requests] == ["review it"]


def _gc_probe(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The environment of a `tether` process that loads ``PROBE`` (tests/test_cli_entry.py),
    and the file it reports to."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    here = Path(__file__).parent
    out = tmp_path / "gc.jsonl"
    path = os.pathsep.join([str(here.parent / "src"), str(here), str(probe)])
    return out, {"PYTHONPATH": path, "GC_PROBE_OUT": str(out)}


def _frozen_report(out: Path) -> None:
    # One process's reports: on SIGUSR1, and a worker's as it exits (the keeper and the
    # forwarder run as `python -I -S`: no probe).
    reports = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({r["pid"] for r in reports}) == 1, reports
    assert reports[0]["frozen"] > 10_000, reports
    assert reports[0]["enabled"], reports


def test_serve_freezes_what_it_loaded(tmp_path: Path, scripted_provider: Provider) -> None:
    """`tether serve` loads its modules with the collector off and freezes them
    (``tether.cli.entry.loading``): a full collection on the event loop the workers' runs share
    goes through the runs' objects, not every module's."""
    p = scripted_provider([Reply("the answer")])
    out, env = _gc_probe(tmp_path)
    with serve(tmp_path, write_config(tmp_path, p.url), env=env) as s:
        run = s.wait_run(s.post("s1", "review it").json()["run"])
        assert run["status"] == "finished", run
        s.proc.send_signal(signal.SIGUSR1)
        wait_until(out.exists, "the probe's report on SIGUSR1", within=10, proc=s)
    _frozen_report(out)


def test_a_worker_freezes_what_it_loaded(tmp_path: Path, scripted_provider: Provider) -> None:
    p = scripted_provider([Reply("the answer")])
    out, env = _gc_probe(tmp_path)
    config = write_config(tmp_path, p.url)
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        run, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="review it")
        w = tether_proc(tmp_path, "worker", "--config", str(config), log="w.log", env=env)
        try:
            wait_until(
                lambda: ledger.get_run(run.id).status is RunStatus.FINISHED, "the run", within=60
            )
            w.send_signal(signal.SIGUSR1)
            wait_until(out.exists, "the probe's report on SIGUSR1", within=10)
        finally:
            stop_proc(w)
    _frozen_report(out)


def test_the_same_request_id_twice_is_one_run(tmp_path: Path, scripted_provider: Provider) -> None:
    p = scripted_provider([Reply("once")])
    with serve(tmp_path, write_config(tmp_path, p.url)) as s:
        first = s.post("s1", "do it", request_id="same")
        again = s.post("s1", "do it", request_id="same")
        assert first.status_code == again.status_code == 202
        assert first.json() == again.json()
        s.wait_run(first.json()["run"])
        after = s.post("s1", "do it", request_id="same")
        assert after.json() == first.json()
        # A duplicate would be a run of its own: wait until the worker has nothing left to do.
        with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
            wait_until(
                lambda: not (ledger.queued_runs("s1") or ledger.live_runs(session="s1")),
                "s1 has no queued or live run",
                proc=s,
            )
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        assert [r.id for r in ledger.runs("s1")] == [first.json()["run"]]
    assert len(p.task_requests) == 1


def test_401_without_a_valid_token_and_403_when_admission_denies(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider([])
    config = write_config(tmp_path, p.url)
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        # "secret": opened by a request carrying repo:acme/api (ana is granted repo:acme/*).
        ledger.ensure_session("secret")
        fence = ledger.claim_run(ledger.create_run("secret", "rev").id)
        msg = {"role": "user", "content": [{"type": "text", "text": "hidden"}], "timestamp": 1}
        ledger.append(
            fence,
            [NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=msg, sources=("repo:acme/api",))],
            request=True,
        )
        ledger.end_run(fence, RunStatus.FINISHED, extra={"answer": None})
        # "mixed": an open opening row, then one row bob may not read.
        ledger.ensure_session("mixed")
        fence = ledger.claim_run(ledger.create_run("mixed", "rev").id)
        open_msg = {**msg, "content": [{"type": "text", "text": "open"}]}
        ledger.append(fence, [NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=open_msg)])
        ledger.append(
            fence,
            [NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=msg, sources=("repo:acme/x",))],
        )
        ledger.end_run(fence, RunStatus.FINISHED)
    with serve(tmp_path, config, workers=0) as s:
        assert s.client.get("/v1/sessions").status_code == 401
        assert s.client.get("/v1/sessions", headers=auth("nope")).status_code == 401
        bad = s.client.post(
            "/v1/sessions/x/requests",
            json={"agent": "rev", "text": "t"},
            headers={"Authorization": "Basic abc"},
        )
        assert bad.status_code == 401
        assert s.client.get("/healthz").status_code == 200  # no token needed

        assert s.get("/v1/sessions/secret/rows", "bob-token").status_code == 403
        assert s.get("/v1/sessions/secret/rows", "ana-token").status_code == 200
        denied = s.post("secret", "follow up", token="bob-token")
        assert denied.status_code == 403, denied.text
        assert denied.json()["detail"]["reason"] == "access_denied"
        assert s.get("/v1/sessions/secret/context", "bob-token", agent="rev").status_code == 403
        assert [x["session"] for x in s.get("/v1/sessions", "bob-token").json()["sessions"]] == [
            "mixed"
        ]
        rows = s.get("/v1/sessions/mixed/rows", "bob-token").json()
        assert rows["withheld"] == [2]
        assert rows["rows"][1] == {"type": "row", "session": "mixed", "seq": 2, "withheld": True}
        assert "hidden" not in s.get("/v1/sessions/mixed/rows", "bob-token").text
        shown = s.get("/v1/sessions/mixed/rows", "ana-token").json()
        assert shown["withheld"] == []
        assert shown["rows"][1]["message"]["content"][0]["text"] == "hidden"
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        assert len(ledger.runs("secret")) == 1, "a refused request writes nothing"


def test_events_stream_and_resume_with_last_event_id(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": "sleep 0.5; echo hi"})]),
            Reply("all done, the answer", chunk_chars=4, chunk_delay_s=0.01),
        ]
    )
    with serve(tmp_path, write_config(tmp_path, p.url)) as s:
        run = s.post("s1", "go").json()["run"]
        events = sse_events(s.client, run)
        kinds = [e["event"] for e in events]
        assert kinds[0] == "status"
        assert kinds[-2:] == ["checkpoint", "end"]
        assert events[-1]["data"]["status"] == "finished"
        assert events[-1]["data"]["answer"] == "all done, the answer"
        rows = [e for e in events if e["event"] == "row"]
        seqs = [e["data"]["seq"] for e in rows]
        assert seqs == list(range(1, len(seqs) + 1))
        assert len(seqs) >= 4
        assert [e["id"] for e in rows] == [str(q) for q in seqs]
        assert "running" in [e["data"]["status"] for e in events if e["event"] == "status"]
        # The worker is in this process: text deltas and tool calls stream too.
        deltas = "".join(e["data"]["delta"] for e in events if e["event"] == "text")
        assert "all done, the answer" in deltas
        assert {e["data"]["phase"] for e in events if e["event"] == "tool"} == {"start", "end"}
        # Resume after the second row: rows 3.. again from the ledger, then the end.
        resumed = sse_events(s.client, run, last_event_id=rows[1]["id"])
        again = [e["data"]["seq"] for e in resumed if e["event"] == "row"]
        assert again == seqs[2:]
        assert [e["event"] for e in resumed][-2:] == ["checkpoint", "end"]
        resumed_mid = sse_events(s.client, run, last_event_id=f"{seqs[-1]}.3")
        assert [e["event"] for e in resumed_mid] == ["status", "checkpoint", "end"]


def test_two_requests_on_a_session_run_one_after_the_other(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    live = {"s1": 0, "s1_most": 0, "all": 0, "all_most": 0}
    lock = threading.Lock()
    elsewhere_asked = threading.Event()

    def slow(req: RecordedRequest) -> Reply:
        mine = req.last_user_text in ("first", "second")
        with lock:
            live["all"] += 1
            live["all_most"] = max(live["all_most"], live["all"])
            if mine:
                live["s1"] += 1
                live["s1_most"] = max(live["s1_most"], live["s1"])
        if req.last_user_text == "elsewhere":
            elsewhere_asked.set()
        elif req.last_user_text == "first":
            # The first run stays live until the other session's run has reached the provider
            # (it must not wait for s1's runs); a second s1 run started meanwhile would show.
            elsewhere_asked.wait(60)
        with lock:
            live["all"] -= 1
            if mine:
                live["s1"] -= 1
        return Reply(f"answer to {req.last_user_text}")

    p = scripted_provider(slow)
    with serve(tmp_path, write_config(tmp_path, p.url), workers=3) as s:
        first = s.post("s1", "first").json()["run"]
        second = s.post("s1", "second").json()["run"]
        other = s.post("s2", "elsewhere").json()["run"]
        a, b, c = s.wait_run(first), s.wait_run(second), s.wait_run(other)
        assert a["answer"] == "answer to first"
        assert b["answer"] == "answer to second"
        assert c["status"] == "finished"
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        r1, r2 = ledger.runs("s1")
        assert r1.ended is not None
        assert r2.started is not None
        assert r1.ended <= r2.started, "the second run started before the first ended"
        assert r2.extra["view"]["previous_request"]["run"] == first
        (elsewhere,) = ledger.runs("s2")
        assert elsewhere.started is not None
        assert elsewhere.started < r2.ended, "the other session's run waited for s1's runs"
    assert live["s1_most"] == 1, "two runs of one session reached the provider at once"


def test_steer_goes_into_the_live_run_with_the_senders_actor(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": "sleep 3; echo slow"})]),
            Reply("steered answer"),
        ]
    )
    with serve(tmp_path, write_config(tmp_path, p.url)) as s:
        run = s.post("s1", "start the long job").json()["run"]
        p.wait_for_requests(1, timeout=30)
        steered = s.post("s1", "also check the tests", token="carl-token", deliver="steer")
        assert steered.status_code == 202, steered.text
        assert steered.json()["status"] == "delivered"
        assert steered.json()["run"] == run
        done = s.wait_run(run)
        assert done["answer"] == "steered answer"
        rows = s.get("/v1/sessions/s1/rows").json()["rows"]
        users = [
            (r["actor"], r["message"]["content"][0]["text"])
            for r in rows
            if r["message"]["role"] == "user"
        ]
        assert users == [("user:ana", "start the long job"), ("user:carl", "also check the tests")]
        # After the run ended, a steer becomes the session's next queued run.
        late = s.post("s1", "one more thing", token="carl-token", deliver="steer")
        assert late.json()["status"] == "queued"
        assert late.json()["run"] != run
    assert "also check the tests" in p.task_requests[1].user_texts


@pytest.mark.slow
def test_a_request_posted_here_wakes_the_idle_worker_and_the_live_runs_relay(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    """With ``poll_s`` at a minute, only the post's own wake-up gets a run claimed and a steer
    delivered in time: polling alone would claim the second run after up to a minute, and the
    steer would wait past ``relay_wait_s`` (5 s) and be answered as queued."""
    p = scripted_provider(
        [
            Reply("first"),
            Reply(tool_calls=[ToolCall("bash", {"command": "sleep 3; echo slow"})]),
            Reply("steered answer"),
        ]
    )
    with serve(tmp_path, write_config(tmp_path, p.url, poll_s=60)) as s:
        first = s.post("s1", "one").json()["run"]
        assert s.wait_run(first, timeout=30)["answer"] == "first"
        # The worker found nothing more after the first run: it idles for poll_s now.
        posted = time.monotonic()
        run = s.post("s1", "start the long job").json()["run"]
        p.wait_for_requests(2, timeout=20)
        assert time.monotonic() - posted < 20, "the worker waited for its poll to claim the run"
        steered = s.post("s1", "also check the tests", token="carl-token", deliver="steer")
        assert steered.status_code == 202, steered.text
        assert (steered.json()["status"], steered.json()["run"]) == ("delivered", run)
        assert s.wait_run(run, timeout=30)["answer"] == "steered answer"


def test_follow_up_goes_into_the_live_run_once_it_would_stop(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": "sleep 3; echo slow"})]),
            Reply("first answer"),
            Reply("answer to the follow-up"),
        ]
    )
    with serve(tmp_path, write_config(tmp_path, p.url)) as s:
        run = s.post("s1", "start the long job").json()["run"]
        p.wait_for_requests(1, timeout=30)
        followed = s.post("s1", "also check the tests", token="carl-token", deliver="follow_up")
        assert followed.status_code == 202, followed.text
        assert followed.json()["status"] == "delivered"
        assert followed.json()["run"] == run
        done = s.wait_run(run)
        assert done["status"] == "finished", done
        assert done["answer"] == "answer to the follow-up"
        rows = s.get("/v1/sessions/s1/rows").json()["rows"]
        said = [
            (r["actor"], r["message"]["role"], c["text"])
            for r in rows
            if r["message"]["role"] in ("user", "assistant")
            for c in r["message"]["content"]
            if c.get("type") == "text"
        ]
        # Not a steer: pi took it once the run would have stopped, after the first answer.
        assert said == [
            ("user:ana", "user", "start the long job"),
            ("agent:rev", "assistant", "first answer"),
            ("user:carl", "user", "also check the tests"),
            ("agent:rev", "assistant", "answer to the follow-up"),
        ]
        with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
            live, relayed = ledger.runs("s1")
        # The request's own queued run ended as delivered into the live one: never run itself.
        assert live.id == run
        assert relayed.status is RunStatus.FINISHED
        assert relayed.started is None
        assert relayed.extra["delivered_into"] == run
        assert relayed.extra["deliver"] == "follow_up"
    assert len(p.task_requests) == 3
    assert "also check the tests" not in p.task_requests[1].user_texts
    assert p.task_requests[2].last_user_text == "also check the tests"


def test_healthz_and_metrics_need_no_token_and_v1_does(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with serve(tmp_path, config, workers=0) as s:
        health = s.client.get("/healthz")
        assert health.json()["status"] == "ok"
        assert "tether_runs_queued 0" in s.client.get("/metrics").text
        r = s.client.get("/v1/runs/nope", headers=auth())
        assert r.status_code == 404
        assert s.post("s1", "  \n ").status_code == 422, "a blank request"
        unknown = s.client.post(
            "/v1/sessions/s1/requests", json={"agent": "nobody", "text": "hi"}, headers=auth()
        )
        assert unknown.status_code == 422
        assert "unknown agent 'nobody'" in unknown.text
        # Over [followup] request_max_bytes (a quarter of the budget): refused, as tether run is.
        huge = s.post("s1", "x" * 200_000)
        assert huge.status_code == 409, huge.text
        assert huge.json()["detail"]["reason"] == "request_too_large"
        assert s.get("/v1/sessions").json() == {"sessions": []}, "nothing was written"
        with pytest.raises(httpx.HTTPStatusError):
            s.client.get("/v1/runs/nope").raise_for_status()


def test_a_second_sigterm_during_the_drain_exits_at_once_and_recover_resumes_the_run(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider(
        [
            # Long enough that both signals land while the tool runs, on a loaded machine too.
            Reply(tool_calls=[ToolCall("bash", {"command": "sleep 8; echo slept"})]),
            Reply("answer after the signals"),
        ]
    )
    config = write_config(tmp_path, p.url, drain_s=60)
    with serve(tmp_path, config) as s:
        run = s.post("s1", "the long job").json()["run"]
        p.wait_for_requests(1, timeout=30)  # pi is in the bash tool now
        os.kill(s.proc.pid, signal.SIGTERM)
        # The first SIGTERM closes the listener, then the lifespan stops the worker: it drains.
        deadline = time.monotonic() + 10
        while True:
            try:
                s.client.get("/healthz", timeout=1)
            except httpx.TransportError:
                break
            assert time.monotonic() < deadline, "the first SIGTERM did not stop serving"
            time.sleep(0.05)
        wait_until(lambda: STOPPING in s.output(), "the worker stopping", proc=s)
        assert s.proc.poll() is None, "still draining: the live run has 60 s"
        second = time.monotonic()
        os.kill(s.proc.pid, signal.SIGTERM)
        assert s.proc.wait(10) == 1, s.output()
        assert time.monotonic() - second < 2, "the second SIGTERM did not exit at once"
    assert len(p.task_requests) == 1, "the run did not go on inside the server"
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        assert ledger.get_run(run).status is RunStatus.RUNNING
        lease = ledger.lease(run)
        assert lease is not None
        assert not lease.expired(time.time()), "not handed over: the lease was left as it was"
    # pi lives on under its keeper: `tether recover` resumes the run on it.
    rec = tether_proc(tmp_path, "recover", "--config", str(config), "--json", log="recover.log")
    try:
        assert rec.wait(60) == 0, (tmp_path / "recover.log").read_text()
    finally:
        stop_proc(rec)
    lines = (tmp_path / "recover.log").read_text().splitlines()
    [item] = [json.loads(line) for line in lines if line.startswith("{")]
    assert item["resolution"] == "resumed"
    assert item["outcome"]["answer"] == "answer after the signals"
    assert len(p.task_requests) == 2, "one pi, one prompt: the tool's result, then the answer"


def test_a_serve_log_carries_no_deprecation_warning(tmp_path: Path) -> None:
    """Every warning shown (PYTHONWARNINGS=default), the routes that answer 422 taken: Starlette
    warned on its old name of that status, once per process, into the serve log."""
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with serve(tmp_path, config, workers=0, env={"PYTHONWARNINGS": "default"}) as s:
        assert s.post("s1", "hi", agent="nobody").status_code == 422
        assert s.get("/v1/sessions/s1/context", agent="nobody").status_code in (404, 422)
        s.post("s1", "open the session")  # queued: no worker here
        assert s.get("/v1/sessions/s1/context", agent="nobody").status_code == 422
        note = s.client.post(
            "/v1/sessions/s1/notes", json={"agent": "nobody", "text": "n"}, headers=auth()
        )
        assert note.status_code == 422
        assert s.get("/sessions/s1/next.json", agent="nobody").status_code == 422
        assert s.client.get("/healthz").status_code == 200
    log = s.output()
    assert "Warning" not in log, log


@pytest.mark.slow
@pytest.mark.parametrize("deliver", ["steer", "follow_up"])
def test_a_follow_up_during_the_summary_is_queued_out_of_it_and_runs_next_with_the_checkpoint(
    tmp_path: Path, scripted_provider: Provider, deliver: str
) -> None:
    """Once the task settled and the checkpoint's ``compact`` is on its way, the run no longer
    takes relayed messages: one posted while pi makes the summary waits the relay's 5 s, is
    answered ``queued`` as the next run, never reaches the summary request (nothing is drained
    into the compaction), and runs after the checkpoint, with it in its view."""
    mark = "SUMMARY-MARK-relay"
    p = scripted_provider(
        route(
            task=[
                Reply(tool_calls=[ToolCall("bash", {"command": "seq 1 3000"})]),
                Reply("first answer"),
                Reply("answer to the follow-up"),
            ],
            summary=[Reply(f"## Goal\n{mark}", delay_s=8), Reply("## Goal\nthe next run's")],
        )
    )
    cfg = write_config(tmp_path, p.url, extra="[followup]\nbudget_bytes = 4000\n")
    with serve(tmp_path, cfg) as s:
        run = s.post("s1", "start the long job").json()["run"]
        wait_until(lambda: p.summary_requests, what="the summary request", within=60)
        posted = time.monotonic()
        late = s.post("s1", "also check the tests", token="carl-token", deliver=deliver)
        waited = time.monotonic() - posted
        assert late.status_code == 202, late.text
        assert late.json()["status"] == "queued", late.json()
        assert late.json()["run"] != run
        assert waited >= 4, f"answered after {waited:.1f} s: the relay was not waited for"
        done = s.wait_run(run, timeout=60)
        assert (done["answer"], done["checkpoint"]) == ("first answer", "written"), done
        after = s.wait_run(late.json()["run"], timeout=60)
        assert after["answer"] == "answer to the follow-up", after
    # The next run makes its own checkpoint, after it answered: the first summary is the one.
    summary, _ = p.summary_requests
    assert not summary.contains("also check the tests")
    first, _, nxt = p.task_requests
    assert not first.contains("also check the tests")
    assert summary.index < nxt.index
    assert nxt.contains(mark)  # the checkpoint, in the next run's view
    assert "also check the tests" in nxt.user_texts[-1]
