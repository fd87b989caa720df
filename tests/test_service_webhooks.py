"""Webhooks against a real `tether serve` (the real pi, the scripted provider), with receivers
on 127.0.0.1 in the test: every run's end reaches an endpoint that was down while the runs
ended, once it is up, each signed and each event id acknowledged once; an endpoint that never
answers does not delay it; a serve process killed (SIGKILL) in the middle of attempts loses
nothing once another starts. On SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pg import fresh_schema_url
from provider import Fail, RecordedRequest, Reply, ScriptedProvider
from service_support import free_port, serve, wait_until, write_config
from tether.ledger import open_ledger

Provider = Callable[..., ScriptedProvider]
SECRET = "whsec-test-7f3a"
ENV = {"TETHER_TEST_HOOK_SECRET": SECRET}
RUN_KEYS = {
    "id",
    "type",
    "at",
    "run",
    "session",
    "agent",
    "actor",
    "status",
    "answer",
    "checkpoint",
    "stop_reason",
    "error",
    "delivered_into",
    "limits_hit",
}


def verify(secret: bytes, header: str, body: bytes, tolerance_s: int = 300) -> bool:
    """The receiver's check, as docs/contracts.md shows it."""
    parts = dict(p.split("=", 1) for p in header.split(","))
    t = int(parts["t"])
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return abs(time.time() - t) <= tolerance_s and hmac.compare_digest(expected, parts["v1"])


@dataclass
class Got:
    headers: dict[str, str]
    body: bytes
    answered: int
    at: float

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Receiver:
    """An HTTP endpoint on 127.0.0.1: ``answer`` decides each request's status (``None``:
    hold it unanswered until :meth:`release`)."""

    port: int = field(default_factory=free_port)
    answer: int | None = 200
    got: list[Got] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _released: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.answer
                if status is None:
                    with receiver._lock:
                        receiver.got.append(Got(dict(self.headers), body, 0, time.monotonic()))
                    receiver._released.wait(60)
                    status = 503
                else:
                    with receiver._lock:
                        receiver.got.append(Got(dict(self.headers), body, status, time.monotonic()))
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def release(self) -> None:
        self._released.set()

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def acked(self) -> list[Got]:
        with self._lock:
            return [g for g in self.got if 200 <= g.answered < 300]


@contextlib.contextmanager
def black_hole() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


def _webhooks(*urls: str, timeout_s: float = 2) -> str:
    endpoints = "".join(
        f'\n[[service.webhooks.endpoints]]\nurl = "{u}"\nsecret_env = "TETHER_TEST_HOOK_SECRET"\n'
        for u in urls
    )
    return (
        "\n[service.webhooks]\nbackoff_base_s = 0.5\nbackoff_cap_s = 2\n"
        f"timeout_s = {timeout_s}\npoll_s = 0.2\nmax_attempts = 1000\n{endpoints}"
    )


def _script(req: RecordedRequest) -> Reply | Fail:
    if "fail" in req.last_user_text:
        return Fail(400, "the model refuses this one")
    return Reply(f"answer to {req.last_user_text}")


def _check_events(acked: list[Got], runs: dict[str, dict[str, Any]]) -> None:
    """Every run's end acknowledged exactly once, signed, shaped as GET /v1/runs answers."""
    ids = [g.event["id"] for g in acked]
    assert len(ids) == len(set(ids)), f"an event id was acknowledged twice: {ids}"
    assert {g.event["run"] for g in acked} == set(runs)
    for g in acked:
        event = g.event
        assert verify(SECRET.encode(), g.headers["Tether-Signature"], g.body), g.headers
        assert not verify(b"another secret", g.headers["Tether-Signature"], g.body)
        assert g.headers["Idempotency-Key"] == g.headers["Tether-Event-Id"] == event["id"]
        assert g.headers["Tether-Event-Type"] == event["type"] == "run.ended"
        assert g.headers["Content-Type"] == "application/json"
        assert set(event) == RUN_KEYS, event
        run = runs[event["run"]]
        for key in ("session", "agent", "actor", "status", "answer", "checkpoint", "stop_reason"):
            assert event[key] == run[key], (key, event, run)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_endpoint_down_for_20_s_gets_every_run_end_and_a_dead_one_delays_nothing(
    tmp_path: Path, scripted_provider: Provider, backend: str
) -> None:
    p = scripted_provider(_script)
    up = Receiver()  # bound only after 20 s: connections refused until then
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(fresh_schema_url()) if backend == "postgres" else None
        dead_port = stack.enter_context(black_hole())
        dead = f"http://127.0.0.1:{dead_port}/hook"
        config = write_config(tmp_path, p.url, ledger_url=url, extra=_webhooks(up.url, dead))
        started = time.monotonic()
        s = stack.enter_context(serve(tmp_path, config, env=ENV))
        texts = ["one", "two", "please fail", "four", "five"]
        posted = [s.post(f"s{i}", text) for i, text in enumerate(texts)]
        assert all(r.status_code == 202 for r in posted), [r.text for r in posted]
        runs = {r.json()["run"]: s.wait_run(r.json()["run"]) for r in posted}
        assert sorted(r["status"] for r in runs.values()) == ["failed"] + ["finished"] * 4
        assert up.got == []
        time.sleep(max(0.0, 20 - (time.monotonic() - started)))
        up.start()
        stack.callback(up.stop)
        came = time.monotonic()
        wait_until(lambda: len(up.acked()) >= len(runs), "every run end at the endpoint", 30, s)
        took = max(g.at for g in up.acked()) - came
        # the backoff is capped at 2 s (jittered) and polled every 0.2 s; the dead endpoint's
        # attempts (2 s each, never answered) hold up none of these
        assert took < 8, f"the endpoint that came back waited {took:.1f} s"
        time.sleep(1.5)  # nothing more comes: no event twice
        _check_events(up.acked(), runs)
        with open_ledger(url or f"sqlite://{tmp_path}/ledger.db") as ledger:
            to_dead = ledger.deliveries(endpoint=dead)
            to_up = ledger.deliveries(endpoint=up.url)
        assert {d.run for d in to_dead} == set(runs)
        assert all(d.state == "pending" and d.attempts >= 2 for d in to_dead), to_dead
        assert all("no answer within 2" in (d.last_error or "") for d in to_dead), to_dead
        assert all(d.state == "delivered" and d.last_status == 200 for d in to_up), to_up
        assert all(d.attempts >= 2 for d in to_up), "the endpoint was down: it was retried"


@pytest.mark.slow
def test_a_serve_killed_in_the_middle_of_attempts_loses_nothing(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider(_script)
    hook = Receiver(answer=None).start()  # holds every request unanswered
    try:
        config = write_config(tmp_path, p.url, extra=_webhooks(hook.url, timeout_s=3))
        with serve(tmp_path, config, env=ENV, log="first.log") as s:
            posted = [s.post(f"s{i}", f"request {i}") for i in range(3)]
            runs = {r.json()["run"]: s.wait_run(r.json()["run"]) for r in posted}
            wait_until(
                lambda: len({g.event["id"] for g in hook.got}) >= 3, "attempts in flight", 20, s
            )
            os.killpg(s.proc.pid, signal.SIGKILL)  # mid-attempt: none was answered
            s.proc.wait(10)
        assert hook.acked() == []
        hook.answer = 200
        hook.release()
        with serve(tmp_path, config, env=ENV, log="second.log") as s:
            # the attempts cut short are due again when their leases end (2 * 3 + 5 s)
            wait_until(lambda: len(hook.acked()) >= 3, "every run end after the restart", 40, s)
            time.sleep(1.5)
        _check_events(hook.acked(), runs)
        held = {g.event["id"] for g in hook.got if g.answered == 0}
        assert held == {g.event["id"] for g in hook.acked()}, "the same events, sent again"
        attempts = [int(g.headers["Tether-Delivery-Attempt"]) for g in hook.acked()]
        assert all(a >= 2 for a in attempts), attempts
    finally:
        hook.stop()
