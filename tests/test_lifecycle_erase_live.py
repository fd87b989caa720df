"""Erasing a session whose run is live in another process
(docs/operations.md#erasure-and-retention, issue 31), on SQLite
and PostgreSQL: a real ``tether run`` drives the real pi, whose scripted model keeps it busy in
a slow bash call; ``tether erase`` (another process) asks the run through the ledger to stop,
the run's own harness stops it and records why, and then the session's rows are gone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pg import postgres_url
from provider import ScriptedProvider
from support.config import workspace_tree
from test_custody_run import by_request, running_run, start, tether, wait_until, write_config
from tether.ledger import RunStatus, open_ledger

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_erasing_a_session_stops_its_live_run_in_another_process_first(
    engine: str, tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    in_tool = workspace_tree(tmp_path) / "in-tool"  # the session's: the sandboxed tool writes it
    provider = scripted_provider(by_request(lambda asked: f"touch {in_tool}; sleep 30"))
    url = f"sqlite://{tmp_path}/ledger.db" if engine == "sqlite" else postgres_url(tmp_path)
    cfg = write_config(tmp_path, provider.url, ledger_url=url)
    store = open_ledger(url)
    try:
        first = tether(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "B")
        assert first.returncode == 0, first.stderr
        proc = start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "A")
        try:
            wait_until(lambda: running_run(store, "s1"), what="the run")
            run = running_run(store, "s1")
            assert run is not None
            wait_until(in_tool.exists, what="the bash tool to run")  # pi is busy in the tool
            assert len(list(store.iter_rows("s1"))) > 2

            # A dry run stops nothing: it names the run it would stop.
            dry = tether(tmp_path, "erase", "--config", str(cfg), "-s", "s1", "--dry-run", "--json")
            assert dry.returncode == 0, dry.stderr
            assert [r["run"] for r in json.loads(dry.stdout)["stopped"]] == [run.id]
            assert store.get_run(run.id).status is RunStatus.RUNNING

            done = tether(
                tmp_path, "erase", "--config", str(cfg), "-s", "s1", "--json", "--actor", "user:op"
            )
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        assert done.returncode == 0, done.stderr
        assert f"stopping run {run.id} on session s1 (soft)…" in done.stderr
        erased = json.loads(done.stdout)
        [stopped] = erased["stopped"]
        assert stopped["run"] == run.id
        assert (stopped["status"], stopped["stop_reason"]) == ("interrupted", "soft_stop")
        # The run's own harness stopped it, and said why, in its record and its output.
        assert proc.returncode == 4, err
        outcome = json.loads(out)
        assert (outcome["status"], outcome["stop_reason"]) == ("interrupted", "soft_stop")
        assert "the session is being erased (by user:op)" in outcome["error"]
        # Then the session went, rows and runs.
        assert store.session("s1") is None
        assert store.run(run.id) is None
        assert list(store.iter_rows("s1")) == []
        assert erased["receipt"]["counts"]["runs"] == 2
    finally:
        store.close()
