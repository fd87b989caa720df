"""What one actor may ask of the service ([service.limits]): queued runs, live runs and requests a
minute, counted in the ledger, so that they hold across every serve process on one PostgreSQL.
Over a limit the answer is 429 with Retry-After, naming the limit, and nothing is written."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from pg import fresh_schema_url
from provider import ScriptedProvider, Stall
from service_support import Served, auth, serve, wait_until, write_config
from tether.ledger import RunStatus, open_ledger

Provider = Callable[..., ScriptedProvider]
NOBODY = "http://127.0.0.1:9/v1"  # no run starts in these tests (no workers), or a stalled one


def _limits(text: str) -> str:
    return f"\n{text.strip()}\n"


def _refusal(r: httpx.Response, limit: str) -> dict[str, Any]:
    """A 429 naming ``limit``, with a Retry-After of whole seconds: its body's detail."""
    assert r.status_code == 429, r.text
    retry = int(r.headers["retry-after"])
    assert retry >= 1
    detail: dict[str, Any] = r.json()["detail"]
    assert detail["status"] == "refused"
    assert detail["reason"] == "limit"
    assert detail["limit"] == limit
    assert detail["retry_after_s"] == retry
    return detail


def _queued(url: str) -> Counter[str]:
    """Actor → queued runs in the ledger."""
    with open_ledger(url) as ledger:
        return Counter(
            r.extra["request"]["actor"]
            for s in ledger.sessions()
            for r in ledger.runs(s.id)
            if r.status is RunStatus.QUEUED
        )


def test_one_token_flooding_new_sessions_queues_the_limit_and_no_more(tmp_path: Path) -> None:
    config = write_config(tmp_path, NOBODY)  # the default limits: 20 queued runs an actor
    url = f"sqlite://{tmp_path}/ledger.db"
    with serve(tmp_path, config, workers=0) as s:
        got = [s.post(f"flood-{i}", f"request {i}") for i in range(40)]
        assert [r.status_code for r in got] == [202] * 20 + [429] * 20, [r.text for r in got]
        for r in got[20:]:
            detail = _refusal(r, "queued")
            assert detail["allowed"] == 20
            assert detail["current"] == 20
            assert "user:ana" in detail["detail"]
        # Nothing was written for a refused request: no run, not even its new session.
        with open_ledger(url) as ledger:
            assert sorted(x.id for x in ledger.sessions()) == sorted(
                f"flood-{i}" for i in range(20)
            )
        assert _queued(url) == {"user:ana": 20}
        # Another actor is not held back by ana's runs.
        assert s.post("bob-1", "hello", token="bob-token").status_code == 202
        # A request repeated with its request_id is answered as before, even at the limit.
        first = s.post("flood-0", "again", request_id="k1")
        assert first.status_code == 429
        withdrawn = s.client.delete(f"/v1/runs/{got[0].json()['run']}", headers=auth())
        assert withdrawn.status_code == 200, withdrawn.text
        kept = s.post("flood-0", "again", request_id="k1")
        assert kept.status_code == 202, kept.text
        assert s.post("flood-0", "again", request_id="k1").json() == kept.json()
    assert _queued(url) == {"user:ana": 20, "user:bob": 1}


def test_requests_a_minute_are_bounded_and_retry_after_says_when(tmp_path: Path) -> None:
    extra = "[service.limits]\nqueued = 100\nper_minute = 5"
    config = write_config(tmp_path, NOBODY, extra=_limits(extra))
    with serve(tmp_path, config, workers=0) as s:
        started = time.monotonic()
        got = [s.post(f"m-{i}", f"request {i}") for i in range(8)]
        assert [r.status_code for r in got] == [202] * 5 + [429] * 3
        for r in got[5:]:
            detail = _refusal(r, "per_minute")
            assert detail["allowed"] == 5
            # The oldest of the five leaves the minute in at most 60 s from its request.
            assert detail["retry_after_s"] <= 60 - int(time.monotonic() - started) + 1
        assert s.post("m-bob", "hello", token="bob-token").status_code == 202


def test_an_actor_of_its_own_gets_its_own_limits(tmp_path: Path) -> None:
    extra = '[service.limits]\nqueued = 2\n[service.limits.actors."user:bob"]\nqueued = 5'
    config = write_config(tmp_path, NOBODY, extra=_limits(extra))
    with serve(tmp_path, config, workers=0) as s:
        ana = [s.post(f"a-{i}", "x").status_code for i in range(4)]
        bob = [s.post(f"b-{i}", "x", token="bob-token").status_code for i in range(7)]
        assert ana == [202, 202, 429, 429]
        assert bob == [202] * 5 + [429] * 2


def _wait_status(s: Served, run: str, status: str) -> None:
    wait_until(lambda: s.get(f"/v1/runs/{run}").json()["status"] == status, f"{run} {status}", 60)


def test_live_runs_are_bounded_at_the_request(tmp_path: Path, scripted_provider: Provider) -> None:
    p = scripted_provider(lambda req: Stall(None))  # every run stays live until stopped
    extra = '[service.limits]\nqueued = 10\n[service.limits.actors."user:ana"]\nlive = 1'
    config = write_config(tmp_path, p.url, extra=_limits(extra))
    with serve(tmp_path, config, workers=3) as s:
        first = s.post("l-1", "first").json()["run"]
        _wait_status(s, first, "running")
        # ana has one live run, her bound: a request that would start another is refused …
        detail = _refusal(s.post("l-2", "second"), "live")
        assert (detail["allowed"], detail["current"]) == (1, 1)
        # … while bob, whose bound is the default (4), starts two.
        bobs = [s.post(f"lb-{i}", "b", token="bob-token").json()["run"] for i in range(2)]
        for run in bobs:
            _wait_status(s, run, "running")
        # A request steered into ana's live run starts no run: it is not held to the bound.
        steer = s.post("l-1", "also this", deliver="steer")
        assert steer.status_code == 202, steer.text
        if steer.json()["status"] == "queued":  # not taken in time: withdraw it
            assert s.client.delete(f"/v1/runs/{steer.json()['run']}", headers=auth()).is_success
        for run, token in ((first, "ana-token"), *((b, "bob-token") for b in bobs)):
            stop = s.client.post(f"/v1/runs/{run}/stop", json={"hard": True}, headers=auth(token))
            assert stop.status_code == 202, stop.text
        for run in (first, *bobs):
            s.wait_run(run, token="bob-token" if run in bobs else "ana-token")
    # The claim side of the bound (a worker starts no more of an actor's queued runs than its
    # bound): tests/test_ledger_limits.py.


@pytest.mark.slow
@pytest.mark.postgres
def test_two_serve_processes_on_one_postgres_queue_no_more_than_the_limit(tmp_path: Path) -> None:
    with fresh_schema_url() as url:
        config = write_config(
            tmp_path, NOBODY, ledger_url=url, extra=_limits("[service.limits]\nqueued = 20")
        )
        with (
            serve(tmp_path, config, workers=0, log="a.log") as a,
            serve(tmp_path, config, workers=0, log="b.log") as b,
        ):

            def post(i: int) -> int:
                side = a if i % 2 else b
                with httpx.Client(base_url=side.url, timeout=60) as client:
                    r = client.post(
                        f"/v1/sessions/pg-{i}/requests",
                        json={"agent": "rev", "text": f"request {i}"},
                        headers=auth(),
                    )
                if r.status_code == 429:
                    _refusal(r, "queued")
                return r.status_code

            # Both floods at once, many requests in flight on each process.
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                codes = Counter(pool.map(post, range(40)))
            assert codes == {202: 20, 429: 20}
            assert _queued(url) == {"user:ana": 20}
            with open_ledger(url) as ledger:
                assert len(ledger.sessions()) == 20
