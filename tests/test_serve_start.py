"""`tether serve` says it started: where it listens, on which ledger, with how many workers and
tokens, and a warning for what would leave it useless; on SQLite it runs one worker unless told
otherwise, so one command does the whole job."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from provider import Reply, ScriptedProvider
from service_support import auth, free_port, stop_proc, tether_proc, write_config

pytestmark = pytest.mark.pi


def _until_said(tmp: Path, log: str, what: str, within: float = 30) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        said = (tmp / log).read_text(errors="replace")
        if what in said:
            return said
        time.sleep(0.05)
    raise AssertionError(f"{what!r} never said:\n{(tmp / log).read_text(errors='replace')}")


def test_serve_on_sqlite_says_where_and_runs_a_request_with_no_more_options(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Reply("served")])
    config = write_config(tmp_path, p.url)
    port = free_port()
    proc = tether_proc(tmp_path, "serve", "--config", str(config), "--port", str(port), log="s")
    try:
        said = _until_said(tmp_path, "s", "tether serve: http://")
        assert f"tether serve: http://127.0.0.1:{port}/ (API /v1" in said, said
        assert f"ledger sqlite://{tmp_path}/ledger.db; 1 worker in this process; 3 tokens" in said
        assert "warning" not in said, said
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            posted = client.post(
                "/v1/sessions/s1/requests", json={"agent": "rev", "text": "hi"}, headers=auth()
            )
            assert posted.status_code == 202, posted.text
            run = posted.json()["run"]
            deadline = time.monotonic() + 60
            while (got := client.get(f"/v1/runs/{run}", headers=auth()).json())["status"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline, got
                time.sleep(0.05)
            assert (got["status"], got["answer"]) == ("finished", "served")
    finally:
        stop_proc(proc)


def test_serve_warns_of_no_tokens_and_no_workers(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    text = config.read_text()
    config.write_text(text.split("[service.tokens]")[0])
    proc = tether_proc(
        tmp_path, "serve", "--config", str(config), "--port", "0", "--workers", "0", log="s"
    )
    try:
        said = _until_said(tmp_path, "s", "no workers")
        assert "0 workers in this process; 0 tokens" in said, said
        assert "warning: no [service.tokens]: every API request is refused (401)" in said, said
        assert "warning: no workers in this process: queued runs wait for `tether worker`" in said
        port = int(said.split("tether serve: http://127.0.0.1:", 1)[1].split("/", 1)[0])
        assert port > 0
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    finally:
        stop_proc(proc)


def test_a_postgresql_ledger_url_is_shown_without_its_password() -> None:
    from tether.cli.serve_cmd import _without_password

    shown = _without_password("postgresql://tether:s3cret@db.example:5432/tether")
    assert shown == "postgresql://tether:***@db.example:5432/tether"
    assert _without_password("sqlite:.tether/ledger.db") == "sqlite:.tether/ledger.db"
