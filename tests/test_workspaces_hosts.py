"""A session's workspace across hosts: two ``tether worker`` processes, each with a state
directory of its own (``[harness] runs_dir``, as two hosts have), one PostgreSQL ledger and one
``[harness] workspaces_dir`` (the storage every host mounts at the same path). The session's
first run, taken by one worker, writes a file in its workspace; its second run, taken by the
other (the first is stopped), finds it there."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from pg import fresh_schema_url
from provider import RecordedRequest, Reply, ScriptedProvider, Step, ToolCall
from service_support import stop_proc, tether_proc
from support.config import write_config
from tether.ledger import Ledger, Run, RunStatus, open_ledger

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def shell(req: RecordedRequest) -> Step:
    """Each request is a bash command; its output is the answer."""
    last = req.messages[-1] if req.messages else {}
    if last.get("role") == "tool":
        return Reply("out: " + RecordedRequest._text(last.get("content")))
    return Reply(tool_calls=[ToolCall("bash", {"command": req.last_user_text})])


def host_config(host: Path, provider_url: str, ledger_url: str, shared: Path, work: Path) -> Path:
    """One host's config: its own state directory, the shared workspaces directory."""
    host.mkdir()
    return write_config(
        host,
        provider_url,
        ledger={"url": ledger_url},
        agents={"rev": {"workdir": str(work)}},
        # runs_dir short: a deep run directory moves its sockets to /tmp
        harness={"runs_dir": "state", "workspaces_dir": str(shared)},
        service={"poll_s": 0.05, "drain_s": 20},
    )


def ended(ledger: Ledger, run_id: str, timeout: float = 120) -> Run:
    deadline = time.monotonic() + timeout
    while True:
        run = ledger.get_run(run_id)
        if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run.status}"
        time.sleep(0.1)


def test_a_session_s_next_run_on_another_worker_finds_its_workspace(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(shell)
    shared = tmp_path / "shared" / "workspaces"
    work = tmp_path / "work"
    work.mkdir()
    (work / "template.txt").write_text("the template\n")
    with fresh_schema_url() as url:
        a = host_config(tmp_path / "a", p.url, url, shared, work)
        b = host_config(tmp_path / "b", p.url, url, shared, work)
        with open_ledger(url) as ledger:
            first, _ = ledger.enqueue_run(
                "m1", "rev", actor="user:ana", text="echo carried over > carried.txt; pwd"
            )
            worker_a = tether_proc(tmp_path, "worker", "--config", str(a), log="a.log")
            try:
                done = ended(ledger, first.id)
            finally:
                stop_proc(worker_a)
            assert done.status is RunStatus.FINISHED, (tmp_path / "a.log").read_text()
            tree = shared / "m1" / "tree"
            assert str(tree) in done.extra["answer"]

            second, _ = ledger.enqueue_run("m1", "rev", actor="user:ana", text="cat carried.txt")
            worker_b = tether_proc(tmp_path, "worker", "--config", str(b), log="b.log")
            try:
                again = ended(ledger, second.id)
            finally:
                stop_proc(worker_b)
            assert again.status is RunStatus.FINISHED, (tmp_path / "b.log").read_text()
            assert "carried over" in again.extra["answer"], again.extra
        with psycopg.connect(url) as conn:
            owners = dict(conn.execute("SELECT id, owner FROM runs").fetchall())
        assert owners[first.id] != owners[second.id], "each run was taken by its own worker"
        assert owners[first.id].endswith(f"/{worker_a.pid}")
        assert owners[second.id].endswith(f"/{worker_b.pid}")
    # Each host kept its own state; the workspace is in the shared directory alone.
    assert (tmp_path / "a" / "state").is_dir()
    assert (tmp_path / "b" / "state").is_dir()
    assert (tree / "carried.txt").read_text() == "carried over\n"
    assert sorted(p.name for p in work.iterdir()) == ["template.txt"]
