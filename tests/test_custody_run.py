"""Session custody end to end (docs/architecture.md#custody, invariants 15-17): ``tether run`` and
``tether
recover`` as a user runs them, the real pi under its keeper, the scripted provider, real signals.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from pg import fresh_schema_url
from provider import Reply, ScriptedProvider, Step, ToolCall
from support.config import workspace_tree
from tether.config import load_config
from tether.files import DISCARDED_DIR
from tether.harness.custody.placement import host_id
from tether.harness.custody.reconcile import reconcile
from tether.ledger import Ledger, Run, RunStatus, open_ledger
from tether.processes import start_time

TETHER = [sys.executable, "-m", "tether"]


def write_config(
    tmp: Path,
    url: str,
    *,
    ledger_url: str | None = None,
    lease_s: float = 30,
    deadline_s: float = 60,
    budget: int = 240_000,
) -> Path:
    path = tmp / "tether.toml"
    path.write_text(
        f"""
[ledger]
url = "{ledger_url or f"sqlite://{tmp}/ledger.db"}"

[followup]
budget_bytes = {budget}

[providers.local]
base_url = "{url}"
context_window = 64000
max_tokens = 1024

[agents.rev]
provider = "local"
model = "scripted"
tools = ["bash"]
deadline_s = {deadline_s}
checkpoint_min_time_s = 0
workdir = "work"

[harness]
runs_dir = "runs"
stop_grace_s = 3
pi_settings = {{ retry = {{ maxRetries = 1, baseDelayMs = 20 }} }}

[custody]
lease_s = {lease_s}
wait_poll_s = 0.05
"""
    )
    return path


def env_with(extra: dict[str, str] | None = None) -> dict[str, str]:
    src = str(Path(__file__).resolve().parent.parent / "src")
    return {**os.environ, "PYTHONPATH": src, **(extra or {})}


def tether(
    tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TETHER, *args],
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=timeout,
        env=env_with(env),
    )


def start(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*TETHER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
        env=env_with(env),
    )


def run_placed(
    tmp: Path, cfg: Path, store: Ledger, session: str = "s1"
) -> tuple[subprocess.Popen[str], Run, dict[str, Any]]:
    """``tether run`` of request ``A`` in ``session``, once the ledger holds the run and pi's
    placement: the process, the run and the placement."""
    proc = start(tmp, "run", "--config", str(cfg), "-s", session, "-a", "rev", "--json", "A")
    try:
        wait_until(lambda: running_run(store, session), what="the run")
        run = running_run(store, session)
        assert run is not None
        return proc, run, keeper_placement(store, run.id)
    except BaseException:
        proc.kill()  # (no run left behind by a failed wait)
        proc.communicate(timeout=10)
        raise


def lose_everything(proc: subprocess.Popen[str], placed: dict[str, Any]) -> None:
    """SIGKILL the CLI, its keeper and pi's group, and wait until pi is gone: what a host's
    crash leaves for ``tether recover``."""
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    os.kill(placed["keeper_pid"], signal.SIGKILL)
    os.killpg(placed["pi_pid"], signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(placed["pi_pid"]), what="pi to die")


def by_request(tool_command: Callable[[str], str | None]) -> Callable[[Any], Step]:
    """A script that answers each request by its text: first a bash call (when
    ``tool_command`` gives one), then ``answer to <request>``."""

    def pick(req: Any) -> Step:
        asked = req.last_user_text
        last = req.messages[-1] if req.messages else {}
        command = tool_command(asked)
        if last.get("role") == "tool" or command is None:
            return Reply(f"answer to {asked}")
        return Reply(tool_calls=[ToolCall("bash", {"command": command})])

    return pick


def wait_until(predicate: Callable[[], object], within: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def running_run(store: Ledger, session: str) -> Run | None:
    live = store.live_runs(session=session)
    return live[0] if live else None


def keeper_placement(store: Ledger, run_id: str) -> dict[str, Any]:
    """The run's placement once its harness has recorded pi in the ledger."""

    def recorded() -> dict[str, Any] | None:
        lease = store.lease(run_id)
        if lease is not None and lease.placement and "pi_pid" in lease.placement:
            return lease.placement
        return None

    wait_until(recorded, what="pi's placement")
    found = recorded()
    assert found is not None
    return found


def run_dirs(runs: Path) -> list[str]:
    """The run directories' names (not what was set aside to be removed: ``.discarded``)."""
    return sorted(p.name for p in runs.iterdir() if p.name != DISCARDED_DIR)


def descendants_with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line names ``marker``, but for the ``rm`` of a run
    directory set aside to be removed (``tether.files.remove_later``: tether's own removal,
    which may still run on a loaded machine)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            argv = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE or marker not in " ".join(argv):
                continue
            if argv[:3] == ["rm", "-rf", "--"] and f"/{DISCARDED_DIR}/" in argv[-1]:
                continue
            found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Ledger]:
    ledger = open_ledger(f"sqlite://{tmp_path}/ledger.db")
    try:
        yield ledger
    finally:
        ledger.close()


def assert_serialized(store: Ledger, session: str) -> list[Run]:
    """Every run's rows are contiguous, and runs never overlap in time."""
    runs = store.runs(session)
    rows = list(store.iter_rows(session))
    order = [r.run for r in rows]
    for run in runs:
        seqs = [r.seq for r in rows if r.run == run.id]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"{run.id} interleaved: {order}"
    ended = sorted(runs, key=lambda r: r.started or "")
    for a, b in itertools.pairwise(ended):
        assert a.ended is not None
        assert b.started is not None
        assert a.ended <= b.started, (a, b)
    return runs


def test_two_tether_runs_on_a_session_serialize_and_the_second_sees_the_first(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    # A's tool holds its run until the test has seen B queued and C refused (a fixed sleep lost
    # that race on a loaded machine: A ended before B's process had started).
    # (In the session's workspace: the sandboxed tool sees nothing else of the test's directory.)
    go = workspace_tree(tmp_path) / "go"
    hold = f"while [ ! -e {go} ]; do sleep 0.05; done; echo went"
    provider = scripted_provider(by_request(lambda asked: hold if asked == "A" else None))
    cfg = write_config(tmp_path, provider.url)
    first = start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "A")
    try:
        wait_until(lambda: running_run(store, "s1"), what="the first run")
        live = running_run(store, "s1")
        assert live is not None
        run_on_s1 = ["run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json"]
        second = start(tmp_path, *run_on_s1, "B")
        wait_until(lambda: store.queued_runs("s1"), what="the second request to queue")
        # A request that waits holds no idle pi: only A's run has a directory (and a pi) now.
        assert run_dirs(tmp_path / "runs") == [live.id]
        busy = tether(tmp_path, *run_on_s1, "--no-wait", "C")
    finally:
        go.touch()  # (a failure above leaves no tool looping)
    out_a, err_a = first.communicate(timeout=120)
    out_b, err_b = second.communicate(timeout=120)
    assert first.returncode == 0, err_a
    assert second.returncode == 0, err_b
    assert json.loads(out_a)["answer"] == "answer to A"
    assert json.loads(out_b)["answer"] == "answer to B"
    assert f"waits for run {live.id}" in err_b

    # --no-wait refused at once, wrote nothing.
    assert busy.returncode == 3, busy.stderr
    assert json.loads(busy.stdout)["status"] == "refused"
    assert json.loads(busy.stdout)["reason"] == "session_busy"
    # Every request's pi started when it was admitted: C's was ended at its gate with its run
    # directory, and A and B ended well, so no run directory and no pi are left.
    assert run_dirs(tmp_path / "runs") == []
    assert descendants_with(str(tmp_path / "runs")) == []

    runs = assert_serialized(store, "s1")
    assert [r.extra["request"]["text"] for r in runs] == ["A", "B"]
    assert all(r.status is RunStatus.FINISHED for r in runs)
    # B's view held A's request and answer (the first run's reply reached the second).
    b_requests = [r for r in provider.requests if r.last_user_text == "B"]
    assert b_requests
    assert b_requests[0].contains("answer to A")
    assert runs[1].extra["view"]["previous_request"]["run"] == runs[0].id


@pytest.mark.slow
def test_several_tether_runs_race_on_postgresql_without_two_live_runs(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    provider = scripted_provider(by_request(lambda asked: "sleep 0.3"))
    with fresh_schema_url() as url:
        cfg = write_config(tmp_path, provider.url, ledger_url=url)
        open_ledger(url).close()
        procs = [
            start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", f"R{i}")
            for i in range(4)
        ]
        results = [p.communicate(timeout=240) for p in procs]
        for p, (_, err) in zip(procs, results, strict=True):
            assert p.returncode == 0, err
        store = open_ledger(url)
        try:
            runs = assert_serialized(store, "s1")
            assert len(runs) == 4
            assert sorted(json.loads(out)["answer"] for out, _ in results) == [
                f"answer to R{i}" for i in range(4)
            ]
            # Each run after the first saw the run before it as its previous request.
            for before, after in itertools.pairwise(runs):
                assert after.extra["view"]["previous_request"]["run"] == before.id
        finally:
            store.close()


def test_a_killed_harness_is_resumed_by_recover_on_the_same_pi(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    # In the session's workspace: what the sandboxed tool may write.
    in_tool = workspace_tree(tmp_path) / "in-tool"
    provider = scripted_provider(by_request(lambda asked: f"touch {in_tool}; sleep 3; echo slept"))
    cfg = write_config(tmp_path, provider.url)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    wait_until(lambda: len(provider.requests) >= 1, what="the first model request")
    wait_until(in_tool.exists, what="the bash tool to run")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    pi = psutil.Process(placed["pi_pid"])
    assert pi.is_running()
    assert start_time(pi.pid) == placed["pi_start"]

    done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
    assert item["resolution"] == "resumed"
    assert item["outcome"]["status"] == "finished"
    assert item["outcome"]["answer"] == "answer to A"
    ended = store.get_run(run.id)
    assert ended.status is RunStatus.FINISHED
    assert ended.epoch == run.epoch + 1
    # Only the original pi ever ran this run: one prompt, two model requests.
    assert len(provider.requests) == 2
    assert not pi.is_running() or pi.status() == psutil.STATUS_ZOMBIE
    rows = list(store.iter_rows("s1"))
    answers = [r for r in rows if r.role == "assistant" and "answer to A" in json.dumps(r.body)]
    assert len(answers) == 1
    ids = [r.entry_id for r in rows if r.entry_id]
    assert len(ids) == len(set(ids))
    # The next run sees it as its previous request, with its answer.
    nxt = tether(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "B")
    assert nxt.returncode == 0, nxt.stderr
    assert provider.requests[-1].contains("answer to A")


def test_a_run_tether_run_touches_after_its_harness_died_is_reconciled_first(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    provider = scripted_provider(by_request(lambda asked: "sleep 2" if asked == "A" else None))
    cfg = write_config(tmp_path, provider.url)
    proc = start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "A")
    wait_until(lambda: len(provider.requests) >= 1, what="the first model request")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    nxt = tether(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "B")
    assert nxt.returncode == 0, nxt.stderr
    runs = assert_serialized(store, "s1")
    assert [r.status for r in runs] == [RunStatus.FINISHED, RunStatus.FINISHED]
    assert runs[0].extra["answer"] == "answer to A"
    assert runs[1].extra["view"]["previous_request"]["run"] == runs[0].id


def test_pi_gone_with_its_harness_ends_the_run_harness_lost(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    provider = scripted_provider(by_request(lambda asked: "sleep 30"))
    cfg = write_config(tmp_path, provider.url)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    wait_until(lambda: len(provider.requests) >= 1, what="the first model request")
    lose_everything(proc, placed)

    done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
    assert item["resolution"] == "harness_lost"
    ended = store.get_run(run.id)
    assert ended.status is RunStatus.INTERRUPTED
    assert ended.extra["stop_reason"] == "harness_lost"
    assert store.get_session("s1").refusing is None


def test_a_placement_whose_pid_was_reused_is_never_signalled(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The recorded pi pid now names another process (its start time differs): the run counts
    as pi gone, and that process is left alone."""
    provider = scripted_provider([Reply("unused")])
    cfg = write_config(tmp_path, provider.url)
    stranger = subprocess.Popen(["sleep", "120"])
    try:
        run, _ = store.enqueue_run("s1", "rev", actor="user:local", text="A")
        fence = store.claim_next(owner="gone", lease_s=0.01)
        assert fence is not None
        started = start_time(stranger.pid)
        assert started is not None
        run_dir = tmp_path / "runs" / run.id
        run_dir.mkdir(parents=True)
        store.heartbeat(
            fence,
            lease_s=0.01,
            placement={
                "host": _host_id(),
                "harness_pid": stranger.pid,
                "harness_start": started - 100,
                "pi_pid": stranger.pid,
                "pi_start": started - 100,  # the pid was reused: another process now
                "run_dir": str(run_dir),
            },
        )
        wait_until(lambda: store.expired_leases(session="s1"), what="the lease to expire")
        done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
        assert done.returncode == 0, done.stderr
        [item] = [json.loads(line) for line in done.stdout.splitlines()]
        assert item["resolution"] == "harness_lost"
        assert stranger.poll() is None, "a process the placement no longer names was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def _host_id() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from tether.harness.custody.placement import host_id

    return host_id()


@pytest.mark.slow
def test_a_placement_on_another_host_ends_unconfirmed_and_the_session_refuses(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    provider = scripted_provider(by_request(lambda asked: "sleep 20" if asked == "A" else None))
    cfg = write_config(tmp_path, provider.url, lease_s=6)
    host_a = {"TETHER_HOST_ID": "host-a"}
    host_b = {"TETHER_HOST_ID": "host-b"}
    proc = start(
        tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "A", env=host_a
    )
    wait_until(lambda: running_run(store, "s1"), what="the run")
    run = running_run(store, "s1")
    assert run is not None
    placed = keeper_placement(store, run.id)
    wait_until(lambda: len(provider.requests) >= 1, what="the first model request")
    proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    proc.communicate(timeout=10)
    try:
        # Within the lease, host b leaves it alone.
        early = tether(tmp_path, "recover", "--config", str(cfg), "--json", env=host_b)
        assert time.monotonic() < killed + 6, "too slow to check within the lease"
        assert early.returncode == 0, early.stderr
        assert early.stdout.strip() == "", early.stdout
        wait_until(
            lambda: store.expired_leases(session="s1"), within=20, what="the lease to expire"
        )
        done = tether(tmp_path, "recover", "--config", str(cfg), "--json", env=host_b)
        assert done.returncode == 0, done.stderr
        [item] = [json.loads(line) for line in done.stdout.splitlines()]
        assert item["resolution"] == "unconfirmed_ending"
        ended = store.get_run(run.id)
        assert (ended.status, ended.extra["stop_reason"]) == (
            RunStatus.INTERRUPTED,
            "unconfirmed_ending",
        )
        refused = tether(
            tmp_path,
            "run",
            "--config",
            str(cfg),
            "-s",
            "s1",
            "-a",
            "rev",
            "--json",
            "B",
            env=host_b,
        )
        assert refused.returncode == 3
        assert json.loads(refused.stdout)["reason"] == "session_refusing"
        # Custody retained: host b never touched pi on host a.
        assert psutil.pid_exists(placed["pi_pid"])
        cleared = tether(tmp_path, "session", "clear", "s1", "--config", str(cfg))
        assert cleared.returncode == 0, cleared.stderr
    finally:
        with_pi = psutil.Process(placed["pi_pid"])
        if start_time(with_pi.pid) == placed["pi_start"]:
            os.killpg(placed["pi_pid"], signal.SIGKILL)
    again = tether(
        tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "B", env=host_b
    )
    assert again.returncode == 0, again.stderr


def test_when_pi_is_killed_its_tool_processes_end_too(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    marker = f"tether-tool-{os.getpid()}-{time.monotonic_ns()}"
    # A tool that starts a process in a session of its own, which a process-group kill misses.
    command = f"setsid sh -c 'sleep 300; : {marker}' & sh -c 'sleep 300; : {marker}-fg'"
    provider = scripted_provider(by_request(lambda asked: command))
    cfg = write_config(tmp_path, provider.url)
    proc, _, placed = run_placed(tmp_path, cfg, store)
    try:
        wait_until(lambda: len(descendants_with(marker)) >= 2, what="the tool processes")
        os.kill(placed["pi_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 3  # stop_grace_s
        while descendants_with(marker):
            assert time.monotonic() < deadline, "pi's tools outlived it"
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, err
        assert json.loads(out)["status"] in ("failed", "interrupted")
    finally:
        if proc.poll() is None:
            proc.kill()
        for left in descendants_with(marker):
            left.kill()


@pytest.mark.slow
def test_sighup_and_sigterm_are_soft_stops(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    # A relative path: in the session's workspace, what the sandboxed tool may write.
    provider = scripted_provider(by_request(lambda asked: "touch in-tool; sleep 30"))
    cfg = write_config(tmp_path, provider.url)
    for sig, session in ((signal.SIGHUP, "s1"), (signal.SIGTERM, "s2")):
        in_tool = workspace_tree(tmp_path, session) / "in-tool"
        proc, run, placed = run_placed(tmp_path, cfg, store, session)
        wait_until(in_tool.exists, what="the bash tool to run")  # pi is well into the run
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, err
        ended = store.get_run(run.id)
        assert ended.extra["stop_reason"] == "soft_stop", (sig, ended.extra)
        assert not psutil.pid_exists(placed["pi_pid"]) or (
            psutil.Process(placed["pi_pid"]).status() == psutil.STATUS_ZOMBIE
        )


def test_a_missing_fifo_disables_the_checkpoint_and_keeps_the_answer(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    big = "seq 1 3000; sleep 2"
    provider = scripted_provider(by_request(lambda asked: big))
    cfg = write_config(tmp_path, provider.url, budget=4000)
    proc, run, _ = run_placed(tmp_path, cfg, store)
    fifo = tmp_path / "runs" / run.id / "commands.fifo"
    wait_until(lambda: len(provider.requests) >= 1, what="the first model request")
    fifo.unlink()
    out, err = proc.communicate(timeout=120)
    result = json.loads(out)
    assert result["answer"] == "answer to A"
    assert result["status"] == "finished"
    assert result["checkpoint"] == "refused:cancelled"
    assert proc.returncode == 0, err  # the answer was authored
    assert "checkpoint: refused (cancelled)" in err
    assert provider.summary_requests == []
    refusing = store.get_session("s1").refusing
    assert refusing is not None
    assert "FIFO" in refusing
    answers = [r for r in store.iter_rows("s1") if "answer to A" in json.dumps(r.body)]
    assert len(answers) == 1


def test_a_waiting_tether_run_killed_in_the_queue_does_not_block_it(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    provider = scripted_provider(by_request(lambda asked: "sleep 2" if asked == "A" else None))
    cfg = write_config(tmp_path, provider.url)
    first = start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "A")
    wait_until(lambda: running_run(store, "s1"), what="the first run")
    waiting = start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "B")
    wait_until(lambda: store.queued_runs("s1"), what="the second request to queue")
    waiting.send_signal(signal.SIGKILL)
    waiting.communicate(timeout=10)
    # B came while A ran: it started no pi to wait with (its pi would start at its turn).
    (queued,) = store.queued_runs("s1")
    assert not (tmp_path / "runs" / queued.id).exists()
    third = tether(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "C")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["answer"] == "answer to C"
    _out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    runs = assert_serialized(store, "s1")
    # B never started and was withdrawn: it wrote nothing.
    assert [r.extra["request"]["text"] for r in runs] == ["A", "C"]


def test_workers_take_a_session_again_once_its_waiting_tether_run_is_gone(
    tmp_path: Path, store: Ledger
) -> None:
    # A `tether run` queued its request and died while waiting: workers pass its run by (it
    # was the waiter's to run) until the reconcile over all sessions confirms the waiter gone
    # and withdraws it; then the session's next request is a worker's.
    gone = subprocess.Popen(["true"])
    gone_start = start_time(gone.pid)
    gone.wait()
    waiter = {"host": host_id(), "harness_pid": gone.pid, "harness_start": gone_start}
    stale, _ = store.enqueue_run("s1", "rev", actor="u:a", text="A", waiter=waiter)
    nxt, _ = store.enqueue_run("s1", "rev", actor="u:a", text="B")
    assert store.claim_next(owner="w1", lease_s=30) is None

    config = load_config(write_config(tmp_path, "http://127.0.0.1:9/v1"))
    anyio.run(functools.partial(reconcile, store, config))

    assert store.run(stale.id) is None
    taken = store.claim_next(owner="w1", lease_s=30)
    assert taken is not None
    assert taken.run == nxt.id


def test_markers_record_a_prompt_or_compact_before_it_is_sent(tmp_path: Path) -> None:
    from tether.harness.custody.markers import Marked, Markers

    markers = Markers(tmp_path)
    assert not markers.sent(Marked.PROMPT)
    assert markers.sent_id(Marked.COMPACT) is None
    # Other commands, and a line that only names one, leave no marker.
    markers.mark(b'{"type":"get_messages","id":"e1.1"}\n{"type":"abort","note":"prompt"}\n')
    assert not markers.sent(Marked.PROMPT)
    assert not markers.sent(Marked.COMPACT)
    markers.mark(b'{"type":"prompt","id":"e1.2","message":"hi"}\n')
    assert markers.sent(Marked.PROMPT)
    assert markers.sent_id(Marked.PROMPT) == "e1.2"
    assert not markers.sent(Marked.COMPACT)
    markers.mark(b'{"type":"compact","id":"e1.3","customInstructions":"x"}\n')
    assert markers.sent_id(Marked.COMPACT) == "e1.3"
    assert (tmp_path / "compact.sent").stat().st_mode & 0o777 == 0o600
