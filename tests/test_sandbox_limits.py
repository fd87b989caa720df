"""A tool that hits a sandbox limit fails, and the run's record names the limit (docs/security.md):
through the real pi, sandboxed, driven by the scripted provider, each limit is hit as a prompt
injection would hit it (a 10 GB file, a memory hog, a fork bomb). The run ends cleanly and its
record's ``extra.limits_hit`` names exactly that limit, at the seq of each tool result that
shows it; a run that hits none has no such key, and a run `tether recover` ends after its harness
and pi died names what its tools hit all the same. The limits are small here (the defaults are
sized for real work, and the machine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from provider import Reply, ScriptedProvider, Step, ToolCall, route
from support.config import workspace_tree
from support.service import service_config
from support.users import unprivileged
from test_custody_run import lose_everything, run_placed, wait_until
from test_custody_run import tether as tether_cli
from test_custody_run import write_config as custody_config
from test_sandbox_escapes import run_tether, write_config
from tether.config import load_config
from tether.ledger import Row, Run, RunStatus, open_ledger
from tether.service.app import create_app

MiB = 1 << 20
GiB = 1 << 30
TETHER = [sys.executable, "-m", "tether"]


def limited(cfg: Path, limits: str, *, sandbox: str | None = None) -> None:
    """The agent's limits (an inline table), a window no tool output here fills (pi would
    compact), and the sandbox kind when given."""
    text = cfg.read_text().replace("context_window = 8192", "context_window = 200000")
    table = f"limits = {{ {limits} }}" + (f'\nsandbox = "{sandbox}"' if sandbox else "")
    cfg.write_text(text.replace('workdir = "work"', f'workdir = "work"\n{table}'))


def script(calls: list[ToolCall], answer: str) -> Callable[..., Step]:
    """One tool call per turn, then the answer (and a summary, should pi ask for one)."""
    steps = [Reply(tool_calls=[call]) for call in calls] + [Reply(answer)] * 3
    return route(task=steps, summary=[Reply("summary")] * 3)


def bash(command: str, timeout: int = 60) -> ToolCall:
    return ToolCall("bash", {"command": command, "timeout": timeout})


def ended(url: str, session: str) -> tuple[Run, list[Row]]:
    """The session's one run and its tool result rows."""
    with open_ledger(url) as store:
        [run] = store.runs(session)
        results = [r for r in store.iter_rows(session) if r.role == "toolResult"]
    return run, results


def text_of(row: Row) -> str:
    return "".join(c.get("text", "") for c in row.body.get("content") or [])


def hits(run: Run) -> list[tuple[str, str, int]]:
    return [(h["limit"], h["tool"], h["seq"]) for h in run.extra.get("limits_hit", [])]


def finished(done: subprocess.CompletedProcess[str], answer: str) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert (result["status"], result["answer"]) == ("finished", answer), result
    return result


def test_a_10_gb_file_and_a_full_tmp_name_the_file_size_limit(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    url = f"sqlite://{tmp_path}/state/ledger.db"
    (tmp_path / "state").mkdir()
    filler = 4 * MiB - 100 * 1024
    calls = [
        bash("head -c 10G /dev/zero > big"),
        # The sandbox's /tmp is memory, as large as the file size limit: two files fill it.
        bash("head -c 3M /dev/zero > /tmp/a; head -c 3M /dev/zero > /tmp/b"),
        bash(f"head -c {filler} /dev/zero > grow.txt; echo MARK >> grow.txt"),
        # pi's own edit tool writing past the limit: it fails, pi goes on.
        ToolCall(
            "edit", {"path": "grow.txt", "edits": [{"oldText": "MARK", "newText": "y" * 200_000}]}
        ),
    ]
    p = scripted_provider(script(calls, "files done"))
    cfg = write_config(tmp_path, p.url, url)
    limited(cfg, f"file_size_bytes = {4 * MiB}, memory_bytes = {GiB}")
    finished(run_tether(tmp_path, cfg, "s1", "sk-files"), "files done")
    run, results = ended(url, "s1")
    assert [r.body["toolName"] for r in results] == ["bash", "bash", "bash", "edit"]
    big, tmp_full, under, edit = results
    assert "File size limit exceeded" in text_of(big), text_of(big)
    assert "No space left on device" in text_of(tmp_full), text_of(tmp_full)
    assert "EFBIG" in text_of(edit), text_of(edit)
    assert not under.body["isError"], text_of(under)
    assert hits(run) == [
        ("file_size", "bash", big.seq),
        ("file_size", "bash", tmp_full.seq),
        ("file_size", "edit", edit.seq),
    ]
    evidence = [h["evidence"] for h in run.extra["limits_hit"]]
    assert evidence == [
        "exit status 153 (SIGXFSZ)",
        "ENOSPC in /tmp (No space left on device)",
        "EFBIG",
    ]
    assert (workspace_tree(tmp_path) / "big").stat().st_size == 4 * MiB
    # Each write went up to the limit, and no further.
    assert (workspace_tree(tmp_path) / "grow.txt").stat().st_size == 4 * MiB
    shown = subprocess.run(
        [*TETHER, "log", "-s", "s1", "--config", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    line = " ".join(shown.stdout.split())
    seqs = f"bash at seq {big.seq}, bash at seq {tmp_full.seq}, edit at seq {edit.seq}"
    assert f"limits hit: file_size ({seqs})" in line, shown.stdout


def test_a_memory_hog_names_the_memory_limit_on_the_record_and_the_session_page(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    # The ledger where service_config's service looks for it, outside the workdir.
    url = f"sqlite://{tmp_path}/ledger.db"
    calls = [
        bash("python3 -c 'b = bytearray(8 << 30)'"),
        bash("head -c 2G /dev/zero | tail | wc -c"),
        bash("echo still here"),
    ]
    p = scripted_provider(script(calls, "memory done"))
    cfg = write_config(tmp_path, p.url, url)
    limited(cfg, f"memory_bytes = {GiB}")
    finished(run_tether(tmp_path, cfg, "s1", "sk-memory"), "memory done")
    run, results = ended(url, "s1")
    hog, tail, after = results
    assert "MemoryError" in text_of(hog), text_of(hog)
    assert "memory exhausted" in text_of(tail), text_of(tail)
    assert "still here" in text_of(after)
    assert hits(run) == [("memory", "bash", hog.seq), ("memory", "bash", tail.seq)]

    service_config(tmp_path, grants={"user:local": []}, tokens={"local-token": "user:local"})
    with open_ledger(url) as ledger, TestClient(create_app(load_config(cfg), ledger)) as c:
        auth = {"Authorization": "Bearer local-token"}
        header = c.get("/sessions/s1.json", headers=auth).json()["runs"][run.id]
        assert header["limits_hit"] == f"memory (bash at seq {hog.seq}, bash at seq {tail.seq})"
        page = c.get("/sessions/s1", headers=auth).text
        assert f"limits hit: memory (bash at seq {hog.seq}" in page
        api = c.get(f"/v1/runs/{run.id}", headers=auth).json()["limits_hit"]
        assert [(h["limit"], h["tool"], h["seq"]) for h in api] == hits(run)


@pytest.mark.slow
def test_a_fork_bomb_names_the_process_limit(
    scripted_provider: Callable[..., ScriptedProvider],
) -> None:
    with unprivileged("tether-limits-") as (tmp, uid, user):
        home = tmp / "home"
        home.mkdir()
        url = f"sqlite://{tmp}/state/ledger.db"
        calls = [
            bash("echo before"),
            # The bomb's processes live on until the sandbox ends: it is the last call.
            bash("bomb() { bomb | bomb & }; bomb; sleep 2; echo bombed", timeout=20),
        ]
        p = scripted_provider(script(calls, "bomb done"))
        cfg = write_config(tmp, p.url, url)
        limited(cfg, "processes = 64")
        for path in [tmp, *tmp.rglob("*")]:
            os.chown(path, uid, -1)
        done = run_tether(tmp, cfg, "s1", "sk-bomb", env={"HOME": str(home)}, user=user)
        finished(done, "bomb done")
        run, results = ended(url, "s1")
        before, bomb = results
        assert "fork: retry: Resource temporarily unavailable" in text_of(bomb)
        assert hits(run) == [("processes", "bash", bomb.seq)], run.extra.get("limits_hit")
        assert "before" in text_of(before)


def test_a_run_that_hits_no_limit_names_none_and_an_unconfined_run_names_none(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    url = f"sqlite://{tmp_path}/state/ledger.db"
    (tmp_path / "state").mkdir()
    words = "MemoryError: out of memory\nfork: Resource temporarily unavailable\nFile too large\n"
    calls = [
        bash("echo hello; head -c 1M /dev/zero > small; ls -la small"),
        ToolCall("write", {"path": "words.txt", "content": words}),
        # A file that holds the words is only what it holds: read shows it, naming no failure.
        ToolCall("read", {"path": "words.txt"}),
    ]
    p = scripted_provider(script(calls, "plain done"))
    cfg = write_config(tmp_path, p.url, url)
    limited(cfg, f"file_size_bytes = {4 * MiB}")
    finished(run_tether(tmp_path, cfg, "s1", "sk-plain"), "plain done")
    run, results = ended(url, "s1")
    assert "MemoryError" in text_of(results[2])
    assert run.status is RunStatus.FINISHED
    assert "limits_hit" not in run.extra, run.extra["limits_hit"]

    # Unconfined, no limit applies: the host's own MemoryError is not a limit of the run.
    p2 = scripted_provider(script([bash("python3 -c 'bytearray(1 << 60)'")], "host done"))
    cfg = write_config(tmp_path, p2.url, url)
    limited(cfg, f"memory_bytes = {GiB}", sandbox="none")
    finished(run_tether(tmp_path, cfg, "s2", "sk-host"), "host done")
    run, results = ended(url, "s2")
    assert "MemoryError" in text_of(results[0])
    assert "limits_hit" not in run.extra


def test_a_run_ended_by_recover_after_its_harness_and_pi_died_names_the_limit_hit(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    def pick(req: Any) -> Step:
        if req.is_summary:
            return Reply("summary")
        results = sum(1 for m in req.messages if m.get("role") == "tool")
        if results == 0:
            return Reply(tool_calls=[bash("python3 -c 'b = bytearray(8 << 30)'")])
        return Reply(tool_calls=[bash("sleep 60", timeout=90)])

    p = scripted_provider(pick)
    cfg = custody_config(tmp_path, p.url)
    limited(cfg, f"memory_bytes = {GiB}")
    url = f"sqlite://{tmp_path}/ledger.db"
    with open_ledger(url) as store:
        proc, run, placed = run_placed(tmp_path, cfg, store)
        # The hog's result went to the model: pi sleeps in its next tool. All of it dies.
        wait_until(lambda: len(p.requests) >= 2, what="the hog's result")
        lose_everything(proc, placed)
    done = tether_cli(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["resolution"] for line in done.stdout.splitlines()] == ["harness_lost"]
    ran, results = ended(url, "s1")
    assert ran.id == run.id
    assert ran.extra["stop_reason"] == "harness_lost"
    hog = results[0]
    assert "MemoryError" in text_of(hog)
    assert hits(ran) == [("memory", "bash", hog.seq)]
