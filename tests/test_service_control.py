"""Stopping a live run, withdrawing a queued one and clearing a refusing session over HTTP: each
for the run's requester or an operator ([service] operators; the clear for operators only), 403
for anyone else and 404 for what does not exist, and each recorded with its actor."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from provider import ScriptedProvider, Stall
from service_support import Served, auth, serve, wait_until, write_config
from tether.ledger import RunStatus, open_ledger
from tether.processes import start_time

Provider = Callable[..., ScriptedProvider]
NOBODY = "http://127.0.0.1:9/v1"
OPERATORS = 'operators = ["user:carl"]'


def _stop(s: Served, run: str, token: str, **body: Any) -> httpx.Response:
    return s.client.post(f"/v1/runs/{run}/stop", json=body, headers=auth(token))


def _running(s: Served, run: str) -> None:
    wait_until(lambda: s.get(f"/v1/runs/{run}").json()["status"] == "running", f"{run} live", 60)


def test_a_live_run_is_stopped_by_its_requester_or_an_operator_and_the_stop_recorded(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider(lambda req: Stall(None))
    config = write_config(tmp_path, p.url, extra=OPERATORS)
    url = f"sqlite://{tmp_path}/ledger.db"
    with serve(tmp_path, config, workers=2) as s:
        soft = s.post("st-1", "take your time").json()["run"]
        hard = s.post("st-2", "and you", token="bob-token").json()["run"]
        _running(s, soft)
        _running(s, hard)
        assert _stop(s, soft, "bob-token").status_code == 403  # neither requester nor operator
        assert _stop(s, "r-nope", "ana-token").status_code == 404
        assert _stop(s, soft, "ana-token", hard=False, extra=1).status_code == 422
        # withdrawing is for queued runs only
        assert s.client.delete(f"/v1/runs/{soft}", headers=auth()).status_code == 409
        asked = _stop(s, soft, "ana-token", hard=False)
        assert asked.status_code == 202, asked.text
        assert asked.json() == {
            "run": soft,
            "status": "stopping",
            "hard": False,
            "stopped_by": "user:ana",
        }
        assert _stop(s, hard, "carl-token", hard=True).status_code == 202  # an operator
        ended = s.wait_run(soft)
        assert ended["status"] == "interrupted", ended
        assert ended["stop_reason"] == "soft_stop"
        assert s.wait_run(hard, token="bob-token")["stop_reason"] == "hard_stop"
        assert _stop(s, soft, "ana-token").status_code == 409  # it has ended
    with open_ledger(url) as ledger:
        one, two = ledger.get_run(soft), ledger.get_run(hard)
    assert one.extra["stopped_by"] == "user:ana"
    assert "user:ana" in one.extra["error"]
    assert two.extra["stopped_by"] == "user:carl"


def test_a_queued_run_is_withdrawn_by_its_requester_or_an_operator(tmp_path: Path) -> None:
    config = write_config(tmp_path, NOBODY, extra=OPERATORS)
    url = f"sqlite://{tmp_path}/ledger.db"
    with serve(tmp_path, config, workers=0) as s:
        mine = s.post("w-1", "later").json()["run"]
        bobs = s.post("w-2", "later", token="bob-token").json()["run"]
        assert s.client.delete(f"/v1/runs/{mine}", headers=auth("bob-token")).status_code == 403
        assert s.client.delete("/v1/runs/r-nope", headers=auth()).status_code == 404
        gone = s.client.delete(f"/v1/runs/{mine}", headers=auth())
        assert gone.status_code == 200, gone.text
        assert gone.json() == {"run": mine, "status": "interrupted", "withdrawn_by": "user:ana"}
        assert s.client.delete(f"/v1/runs/{mine}", headers=auth()).status_code == 409
        assert s.client.delete(f"/v1/runs/{bobs}", headers=auth("carl-token")).status_code == 200
        assert s.get(f"/v1/runs/{mine}").json()["stop_reason"] == "withdrawn"
    with open_ledger(url) as ledger:
        assert ledger.get_run(mine).extra["withdrawn_by"] == "user:ana"
        assert ledger.get_run(bobs).extra["withdrawn_by"] == "user:carl"
        assert ledger.get_run(bobs).status is RunStatus.INTERRUPTED


def _refusing_session(url: str, session: str, placement: dict[str, Any] | None = None) -> None:
    """A session whose last run ended without its end confirmed (as reconcile leaves one),
    its placement as given."""
    with open_ledger(url) as ledger:
        run, _ = ledger.enqueue_run(session, "rev", actor="user:ana", text="x")
        fence = ledger.claim_run(run.id)
        if placement is not None:
            ledger.heartbeat(fence, lease_s=30, placement=placement)
        ledger.end_run(fence, RunStatus.INTERRUPTED, extra={"stop_reason": "unconfirmed_ending"})
        ledger.set_refusing(session, "unconfirmed_ending: the test says so")


def test_an_operator_clears_a_refusing_session_once_its_pi_is_gone(tmp_path: Path) -> None:
    config = write_config(tmp_path, NOBODY, extra=OPERATORS)
    url = f"sqlite://{tmp_path}/ledger.db"
    with serve(tmp_path, config, workers=0) as s:
        # A pi of the session's last run still alive on this host (a stand-in with its pid).
        pi = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        try:
            while start_time(pi.pid) is None:
                time.sleep(0.01)
            here = {"pi_pid": pi.pid, "pi_start": start_time(pi.pid), "run_dir": "/nonexistent"}
            from tether.harness.custody.placement import host_id

            _refusing_session(url, "c-1", {"host": host_id(), **here})
            refused = s.post("c-1", "hello")
            assert refused.status_code == 409
            assert refused.json()["detail"]["reason"] == "session_refusing"
            clear = "/v1/sessions/c-1/clear"
            assert s.client.post(clear, headers=auth()).status_code == 403  # not an operator
            assert s.client.post(clear, headers=auth("bob-token")).status_code == 403
            missing = s.client.post("/v1/sessions/nope/clear", headers=auth("carl-token"))
            assert missing.status_code == 404
            alive = s.client.post(clear, headers=auth("carl-token"))
            assert alive.status_code == 409, alive.text
            assert str(pi.pid) in alive.json()["detail"]
        finally:
            pi.kill()
            pi.wait()
        done = s.client.post(clear, headers=auth("carl-token"))
        assert done.status_code == 200, done.text
        assert done.json()["cleared"] is True
        assert done.json()["was"] == "unconfirmed_ending: the test says so"
        assert s.post("c-1", "hello").status_code == 202
        # A pi on another host cannot be checked from here: the operator must say it did.
        _refusing_session(url, "c-2", {"host": "elsewhere", "pi_pid": 1, "pi_start": 1.0})
        far = s.client.post("/v1/sessions/c-2/clear", headers=auth("carl-token"))
        assert far.status_code == 409
        assert "elsewhere" in far.json()["detail"]
        checked = s.client.post(
            "/v1/sessions/c-2/clear", json={"pi_checked": True}, headers=auth("carl-token")
        )
        assert checked.status_code == 200, checked.text
    with open_ledger(url) as ledger:
        one, two = ledger.get_session("c-1"), ledger.get_session("c-2")
    assert one.refusing is None
    assert [(c["by"], c["was"]) for c in one.extra["cleared"]] == [
        ("user:carl", "unconfirmed_ending: the test says so")
    ]
    assert two.extra["cleared"][0]["pi_checked"] is True
