"""A session's workspace across hosts: two ``tether worker`` processes, each with a state
directory of its own (``[harness] runs_dir``, as two hosts have), one PostgreSQL ledger and one
``[harness] workspaces_dir`` (the storage every host mounts at the same path). The session's
first run, taken by one worker, writes a file in its workspace; its second run, taken by the
other (the first is stopped), finds it there."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from pg import fresh_schema_url
from provider import RecordedRequest, Reply, ScriptedProvider, Step, ToolCall
from service_support import workers
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


def run_on_a_worker(
    tmp: Path, ledger: Ledger, config: Path, log: str, text: str
) -> tuple[Run, int]:
    """``text`` queued on session m1 and run by a ``tether worker`` with ``config`` (stopped
    after it): the run, finished, and the worker's pid."""
    queued, _ = ledger.enqueue_run("m1", "rev", actor="user:ana", text=text)
    with workers(tmp, config) as start:
        pid = start(log).pid
        done = ended(ledger, queued.id)
    assert done.status is RunStatus.FINISHED, (tmp / log).read_text()
    return done, pid


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
            on = functools.partial(run_on_a_worker, tmp_path, ledger)
            first, pid_a = on(a, "a.log", "echo carried over > carried.txt; pwd")
            tree = shared / "m1" / "tree"
            assert str(tree) in first.extra["answer"]
            second, pid_b = on(b, "b.log", "cat carried.txt")
            assert "carried over" in second.extra["answer"], second.extra
        with psycopg.connect(url) as conn:
            owners = dict(conn.execute("SELECT id, owner FROM runs").fetchall())
        assert owners[first.id] != owners[second.id], "each run was taken by its own worker"
        assert owners[first.id].endswith(f"/{pid_a}")
        assert owners[second.id].endswith(f"/{pid_b}")
    # Each host kept its own state; the workspace is in the shared directory alone.
    assert (tmp_path / "a" / "state").is_dir()
    assert (tmp_path / "b" / "state").is_dir()
    assert (tree / "carried.txt").read_text() == "carried over\n"
    assert sorted(p.name for p in work.iterdir()) == ["template.txt"]
