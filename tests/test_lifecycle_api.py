"""Fork and erasure at the edges (docs/operations.md#erasure-and-retention): ``POST
/v1/sessions/{s}/fork`` and
``/v1/erasures`` (admins only), ``tether fork`` and ``tether export pi`` of a fork."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from support.service import service_config, text_message
from tether.config import load_config
from tether.interop.pi_export import export_pi
from tether.ledger import Ledger, NewRow, RunStatus, open_ledger
from tether.service.app import create_app

TETHER = Path(sys.executable).with_name("tether")
ANA = {"Authorization": "Bearer ana-token"}
BOB = {"Authorization": "Bearer bob-token"}


def _turn(ledger: Ledger, session: str, text: str, sources: tuple[str, ...] = ()) -> str:
    ledger.ensure_session(session)
    fence = ledger.claim_run(ledger.create_run(session, "rev").id)
    ledger.append(fence, [NewRow.message("user:ana", text_message("user", text))], request=True)
    ledger.append(
        fence,
        [NewRow.message("agent:rev", text_message("assistant", f"re: {text}"), sources=sources)],
    )
    ledger.end_run(fence, RunStatus.FINISHED)
    return fence.run


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[TestClient, Ledger, Path, list[str]]]:
    path = service_config(
        tmp_path,
        grants={"user:ana": ["*"], "user:bob": ["repo:open/*"]},
        tokens={"ana-token": "user:ana", "bob-token": "user:bob"},
        admins=["user:ana"],
        runs_dir=True,
    )
    cfg = load_config(path)
    with open_ledger(cfg.ledger.url) as ledger:
        runs = [
            _turn(ledger, "s1", "one", ("repo:open/a",)),
            _turn(ledger, "s1", "two", ("repo:closed/b",)),
            _turn(ledger, "s1", "three"),
        ]
        with TestClient(create_app(cfg, ledger)) as c:
            yield c, ledger, path, runs


def test_the_fork_route_and_what_the_fork_shows(setup: Any) -> None:
    c, ledger, _, runs = setup
    got = c.post("/v1/sessions/s1/fork", json={"at_run": runs[1], "session": "s2"}, headers=ANA)
    assert got.status_code == 201, got.text
    assert got.json() == {"session": "s2", "from": "s1", "at_run": runs[1], "seq": 4}
    rows = c.get("/v1/sessions/s2/rows", headers=ANA).json()
    assert [r["seq"] for r in rows["rows"]] == [1, 2, 3, 4]
    assert rows["last_seq"] == 4
    # Admission as in s1: bob sees the open answer, and row 4 (closed) is withheld.
    bob = c.get("/v1/sessions/s2/rows", headers=BOB).json()
    assert bob["withheld"] == [4]
    assert c.get("/v1/sessions/s1/rows", headers=BOB).json()["withheld"] == [4]
    view = c.get("/v1/sessions/s2/context", params={"agent": "rev"}, headers=ANA).json()
    assert view["previous_request"]["run"] == runs[1]
    assert "three" not in json.dumps(view)
    # Refusals: an id in use, a run that is not s1's, a run of s1 after the fork point.
    again = c.post("/v1/sessions/s1/fork", json={"at_run": runs[0], "session": "s2"}, headers=ANA)
    assert again.status_code == 409
    later = c.post("/v1/sessions/s2/fork", json={"at_run": runs[2], "session": "s3"}, headers=ANA)
    assert later.status_code == 422
    assert "not a run of session" in later.json()["detail"]
    missing = c.post(
        "/v1/sessions/s1/fork", json={"at_run": "r-none", "session": "s3"}, headers=ANA
    )
    assert missing.status_code == 404
    assert ledger.session("s3") is None


def test_erasure_route_is_for_admins_and_dry_run_matches(setup: Any) -> None:
    c, ledger, _, _ = setup
    body = {"source": "repo:closed/b", "dry_run": True}
    assert c.post("/v1/erasures", json=body, headers=BOB).status_code == 403
    assert c.get("/v1/erasures", headers=BOB).status_code == 403
    dry = c.post("/v1/erasures", json=body, headers=ANA)
    assert dry.status_code == 200, dry.text
    assert dry.json()["rows"] == {"s1": [4]}
    assert [r.seq for r in ledger.iter_rows("s1")] == [1, 2, 3, 4, 5, 6]
    done = c.post("/v1/erasures", json={"source": "repo:closed/b"}, headers=ANA).json()
    assert {k: v for k, v in done.items() if k not in ("dry_run", "receipt")} == {
        k: v for k, v in dry.json().items() if k not in ("dry_run", "receipt")
    }
    assert [r.seq for r in ledger.iter_rows("s1")] == [1, 2, 3, 5, 6]
    receipts = c.get("/v1/erasures", headers=ANA).json()["erasures"]
    assert [(r["actor"], r["selector"], r["counts"]["rows"]) for r in receipts] == [
        ("user:ana", {"source": "repo:closed/b"}, 1)
    ]
    both = c.post("/v1/erasures", json={"source": "x", "session": "s1"}, headers=ANA)
    assert both.status_code == 422
    assert c.post("/v1/erasures", json={"session": "nope"}, headers=ANA).status_code == 404


def test_tether_fork_and_the_export_of_a_fork(setup: Any) -> None:
    _, ledger, path, runs = setup
    done = subprocess.run(
        [str(TETHER), "fork", "-s", "s1", "--at", runs[0], "-n", "s9", "--json", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"session": "s9", "from": "s1", "at_run": runs[0], "seq": 2}
    again = subprocess.run(
        [str(TETHER), "fork", "-s", "s1", "--at", runs[0], "-n", "s9", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 1
    assert "already exists" in again.stderr
    out = io.StringIO()
    export_pi(ledger, "s9", out, cwd="/")
    texts = [
        json.loads(line)["message"]["content"][0]["text"]
        for line in out.getvalue().splitlines()
        if json.loads(line).get("type") == "message"
    ]
    assert texts == ["one", "re: one"]
