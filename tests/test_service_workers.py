"""Workers as separate processes on one PostgreSQL ledger: racing for queued runs, a worker
killed mid-run, a worker stopped with SIGTERM (docs/architecture.md#custody,
docs/contracts.md#the-http-api)."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from pg import fresh_schema_url
from provider import RecordedRequest, Reply, ScriptedProvider, ToolCall
from service_support import serve, stop_proc, tether_proc, write_config
from tether.ledger import Ledger, RunStatus, open_ledger

Provider = Callable[..., ScriptedProvider]
pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _requests(ledger: Ledger, session: str) -> list[tuple[str | None, str]]:
    """(run, text) of each request row of the session (copies written by views excluded)."""
    out = []
    for row in ledger.iter_rows(session):
        if row.role == "user" and "origin" not in row.extra:
            content = row.body["content"]
            out.append((row.run, content[0]["text"] if isinstance(content, list) else content))
    return out


def _wait_all_ended(ledger: Ledger, sessions: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        runs = [r for s in sessions for r in ledger.runs(s)]
        if all(r.status not in (RunStatus.QUEUED, RunStatus.RUNNING) for r in runs):
            return
        if time.monotonic() > deadline:
            left = Counter(r.status.value for r in runs)
            raise TimeoutError(f"runs not ended after {timeout}s: {dict(left)}")
        time.sleep(0.2)


def test_two_workers_race_for_50_runs_over_10_sessions(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    def answer(req: RecordedRequest) -> Reply:
        time.sleep(0.05)
        return Reply(f"answer to {req.last_user_text}")

    p = scripted_provider(answer)
    sessions = [f"s{i}" for i in range(10)]
    with fresh_schema_url() as url:
        # One actor queues all 50: its [service.limits] raised past that.
        limits = "[service.limits]\nqueued = 100\nlive = 10\nper_minute = 200"
        config = write_config(tmp_path, p.url, ledger_url=url, extra=limits)
        with serve(tmp_path, config, workers=0) as s:
            for n in range(5):
                for session in sessions:
                    r = s.post(session, f"{session} request {n}", request_id=f"{session}-{n}")
                    assert r.status_code == 202, r.text
            workers = [
                tether_proc(tmp_path, "worker", "--config", str(config), "-n", "3", log=f"w{i}.log")
                for i in range(2)
            ]
            try:
                with open_ledger(url) as ledger:
                    _wait_all_ended(ledger, sessions, timeout=600)
            finally:
                for w in workers:
                    stop_proc(w)
        with open_ledger(url) as ledger:
            for session in sessions:
                runs = ledger.runs(session)
                assert len(runs) == 5
                assert all(r.status is RunStatus.FINISHED for r in runs), [
                    (r.id, r.status, r.extra.get("error")) for r in runs
                ]
                # Each run once: one request row each, in queue order, answered once.
                assert _requests(ledger, session) == [
                    (r.id, f"{session} request {n}") for n, r in enumerate(runs)
                ]
                assert [r.extra["answer"] for r in runs] == [
                    f"answer to {session} request {n}" for n in range(5)
                ]
                # Never two live on a session: each run started after the one before ended.
                for before, after in itertools.pairwise(runs):
                    assert before.ended is not None
                    assert after.started is not None
                    assert before.ended <= after.started, (before, after)
        with psycopg.connect(url) as conn:
            owners = {r[0] for r in conn.execute("SELECT owner FROM runs")}
        assert len(owners) == 2, "both workers took runs"
    asked = Counter(r.last_user_text for r in p.task_requests)
    assert len(asked) == 50
    assert set(asked.values()) == {1}, "a request reached the provider twice"


def test_sigterm_lets_the_live_run_finish_and_claims_nothing_more(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    def slow(req: RecordedRequest) -> Reply:
        time.sleep(2)
        return Reply(f"answer to {req.last_user_text}")

    p = scripted_provider(slow)
    with fresh_schema_url() as url:
        config = write_config(tmp_path, p.url, ledger_url=url)
        with open_ledger(url) as ledger:
            first, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="first")
            second, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="second")
            w = tether_proc(tmp_path, "worker", "--config", str(config), log="w.log")
            try:
                p.wait_for_requests(1, timeout=60)
                os.killpg(w.pid, signal.SIGTERM)
                assert w.wait(60) == 0, (tmp_path / "w.log").read_text()
            finally:
                stop_proc(w)
            assert ledger.get_run(first.id).status is RunStatus.FINISHED
            assert ledger.get_run(first.id).extra["answer"] == "answer to first"
            assert ledger.get_run(second.id).status is RunStatus.QUEUED


def _assistant_texts(ledger: Ledger, session: str) -> list[str]:
    out = []
    for row in ledger.iter_rows(session):
        if row.role == "assistant" and "origin" not in row.extra:
            out += [c["text"] for c in row.body["content"] if c.get("type") == "text"]
    return out


def test_kill_9_of_a_worker_mid_run_another_reconciles_nothing_lost_or_doubled(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    def answer(req: RecordedRequest) -> Reply:
        if req.last_user_text == "first":
            time.sleep(4)  # the worker is killed while pi waits for this
        return Reply(f"answer to {req.last_user_text}")

    p = scripted_provider(answer)
    with fresh_schema_url() as url:
        config = write_config(tmp_path, p.url, ledger_url=url, lease_s=3)
        with open_ledger(url) as ledger:
            first, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="first")
            second, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="second")
            a = tether_proc(tmp_path, "worker", "--config", str(config), log="a.log")
            b = None
            try:
                p.wait_for_requests(1, timeout=60)
                os.kill(a.pid, signal.SIGKILL)  # the worker only: pi stays with its keeper
                a.wait(10)
                assert ledger.get_run(first.id).status is RunStatus.RUNNING
                b = tether_proc(tmp_path, "worker", "--config", str(config), log="b.log")
                _wait_all_ended(ledger, ["s1"], timeout=120)
            finally:
                stop_proc(a)
                if b is not None:
                    stop_proc(b)
            ended = ledger.get_run(first.id)
            logs = (tmp_path / "b.log").read_text()
            assert ended.status is RunStatus.FINISHED, (ended, logs[-2000:])
            assert ended.epoch >= 2, "the second worker took the run over (a new epoch)"
            assert ended.extra["answer"] == "answer to first"
            assert ledger.get_run(second.id).status is RunStatus.FINISHED
            assert _requests(ledger, "s1") == [(first.id, "first"), (second.id, "second")]
            assert _assistant_texts(ledger, "s1") == ["answer to first", "answer to second"]
    asked = Counter(r.last_user_text for r in p.task_requests)
    assert asked == {"first": 1, "second": 1}


def test_sigterm_past_the_drain_deadline_hands_the_run_over(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    def answer(req: RecordedRequest) -> Reply:
        time.sleep(5)
        return Reply(f"answer to {req.last_user_text}")

    p = scripted_provider(answer)
    with fresh_schema_url() as url:
        config = write_config(tmp_path, p.url, ledger_url=url, drain_s=0.5)
        with open_ledger(url) as ledger:
            run, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="long")
            a = tether_proc(tmp_path, "worker", "--config", str(config), log="a.log")
            b = None
            try:
                p.wait_for_requests(1, timeout=60)
                os.kill(a.pid, signal.SIGTERM)
                assert a.wait(30) == 0
                assert "handed over 1 live run" in (tmp_path / "a.log").read_text()
                lease = ledger.lease(run.id)
                assert lease is not None, "the run is still live: it was not ended"
                assert lease.expired(time.time())
                b = tether_proc(tmp_path, "worker", "--config", str(config), log="b.log")
                _wait_all_ended(ledger, ["s1"], timeout=120)
            finally:
                stop_proc(a)
                if b is not None:
                    stop_proc(b)
            ended = ledger.get_run(run.id)
            assert ended.status is RunStatus.FINISHED, ended
            assert ended.extra["answer"] == "answer to long"
            assert _assistant_texts(ledger, "s1") == ["answer to long"]
    assert len(p.task_requests) == 1


def test_a_second_sigterm_during_the_drain_exits_at_once_and_the_next_worker_resumes(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider(
        [
            # Long enough that both signals land while the tool runs, on a loaded machine too.
            Reply(tool_calls=[ToolCall("bash", {"command": "sleep 8; echo slept"})]),
            Reply("answer to long"),
        ]
    )
    with fresh_schema_url() as url:
        config = write_config(tmp_path, p.url, ledger_url=url, drain_s=60)
        with open_ledger(url) as ledger:
            run, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="long")
            a = tether_proc(tmp_path, "worker", "--config", str(config), log="a.log")
            b = None
            try:
                p.wait_for_requests(1, timeout=60)  # pi is in the bash tool now
                os.kill(a.pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while "stopping: no more claims" not in (tmp_path / "a.log").read_text():
                    assert time.monotonic() < deadline, "the first SIGTERM did not start a drain"
                    time.sleep(0.05)
                assert a.poll() is None, "still draining: the live run has 60 s"
                second = time.monotonic()
                os.kill(a.pid, signal.SIGTERM)
                assert a.wait(10) == 1
                assert time.monotonic() - second < 2, "the second SIGTERM did not exit at once"
                assert "handing over" not in (tmp_path / "a.log").read_text()
                assert len(p.task_requests) == 1
                assert ledger.get_run(run.id).status is RunStatus.RUNNING
                lease = ledger.lease(run.id)
                assert lease is not None
                assert not lease.expired(time.time()), "its lease was left as it was"
                # Its harness is gone from this host: the next worker takes the run over at once.
                b = tether_proc(tmp_path, "worker", "--config", str(config), log="b.log")
                _wait_all_ended(ledger, ["s1"], timeout=60)
            finally:
                stop_proc(a)
                if b is not None:
                    stop_proc(b)
            ended = ledger.get_run(run.id)
            assert ended.status is RunStatus.FINISHED, (ended, (tmp_path / "b.log").read_text())
            assert ended.epoch >= 2, "the second worker took the run over (a new epoch)"
            assert ended.extra["answer"] == "answer to long"
            assert _assistant_texts(ledger, "s1") == ["answer to long"]
    assert len(p.task_requests) == 2, "resumed on the same pi: the tool's result, then the answer"
