"""Finding and stopping a recorded model server (tether.model.process) on real processes, and the
local config it writes. Fast: no model is loaded here (tests/test_local_model.py runs the real one).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tether.config import load_config
from tether.model.localconfig import LOCAL_COMPAT, write_local_config
from tether.model.process import (
    ModelServer,
    ServerState,
    ServerStatus,
    StopOutcome,
    read_state,
    server_status,
    stop_recorded,
    write_state,
)
from tether.processes import start_time


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while start_time(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def group() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A process group like a background server's: a leader and a grandchild (its pid)."""
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    try:
        yield proc, grandchild
    finally:
        for pid in (proc.pid, grandchild):
            if start_time(pid) is not None:
                subprocess.run(["kill", "-9", str(pid)], check=False)
        proc.wait()


def state_for(pid: int, tmp: Path, *, proc_start: int | None = None, port: int = 9) -> ServerState:
    start = start_time(pid)
    assert start is not None
    return ServerState(
        pid=pid,
        port=port,
        model="m.gguf",
        alias="smollm2",
        started_at=time.time(),
        proc_start=start if proc_start is None else proc_start,
        log=str(tmp / "model.log"),
    )


def test_nothing_recorded(tmp_path: Path) -> None:
    assert server_status(tmp_path) == (ServerStatus.NOT_RUNNING, None)
    assert stop_recorded(tmp_path) == (StopOutcome.NOT_RUNNING, None)


def test_state_round_trips(tmp_path: Path, group: tuple[subprocess.Popen[bytes], int]) -> None:
    state = state_for(group[0].pid, tmp_path, port=18080)
    write_state(state, tmp_path / "nested")
    assert read_state(tmp_path / "nested") == state
    assert state.base_url == "http://127.0.0.1:18080/v1"


def test_stop_signals_the_whole_group(
    tmp_path: Path, group: tuple[subprocess.Popen[bytes], int]
) -> None:
    proc, grandchild = group
    write_state(state_for(proc.pid, tmp_path), tmp_path)
    outcome, state = stop_recorded(tmp_path, grace=5.0)
    assert outcome is StopOutcome.STOPPED
    assert state is not None
    assert state.pid == proc.pid
    assert proc.wait(timeout=5) != 0
    assert gone(grandchild)
    assert read_state(tmp_path) is None


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    # Ignored signals are inherited across exec: the whole group ignores SIGTERM.
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60"], start_new_session=True)
    try:
        time.sleep(0.2)  # let the trap be installed
        write_state(state_for(proc.pid, tmp_path), tmp_path)
        began = time.monotonic()
        outcome, _ = stop_recorded(tmp_path, grace=0.5)
        assert outcome is StopOutcome.STOPPED
        assert time.monotonic() - began >= 0.5
        assert proc.wait(timeout=5) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_reused_pid_is_never_signalled(
    tmp_path: Path, group: tuple[subprocess.Popen[bytes], int]
) -> None:
    proc, _ = group
    # Same pid, different start time: the recorded server is gone and the pid belongs to
    # another process now.
    write_state(state_for(proc.pid, tmp_path, proc_start=1), tmp_path)
    assert server_status(tmp_path)[0] is ServerStatus.STALE
    outcome, _ = stop_recorded(tmp_path)
    assert outcome is StopOutcome.STALE
    assert proc.poll() is None
    assert read_state(tmp_path) is None


def test_a_server_stop_kills_descendants_and_reaps_the_child(tmp_path: Path) -> None:
    # The leader dies on SIGTERM; its child ignores it, so only the SIGKILL after the grace
    # period ends it, and by then it has been reparented: psutil listed it before signalling.
    script = "sh -c 'trap \"\" TERM; echo $$; exec sleep 60' & wait"
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    server = ModelServer(proc, state_for(proc.pid, tmp_path))
    try:
        began = time.monotonic()
        server.stop(grace=0.5)
        assert time.monotonic() - began >= 0.5
        assert proc.returncode is not None  # reaped: no zombie left behind
        assert not server.alive()
        assert gone(child)
    finally:
        for pid in (proc.pid, child):
            if start_time(pid) is not None:
                subprocess.run(["kill", "-9", str(pid)], check=False)
        proc.wait()


def test_a_server_that_exited_already_is_reaped_on_stop(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 0.2; exit 3"], start_new_session=True)
    server = ModelServer(proc, state_for(proc.pid, tmp_path))
    time.sleep(0.5)
    began = time.monotonic()
    server.stop(grace=5.0)
    assert time.monotonic() - began < 1.0
    assert proc.returncode == 3
    assert start_time(proc.pid) is None


def test_alive_but_silent_is_not_answering(
    tmp_path: Path, group: tuple[subprocess.Popen[bytes], int]
) -> None:
    # Port 9 (discard) on loopback: nothing answers HTTP there.
    write_state(state_for(group[0].pid, tmp_path, port=9), tmp_path)
    assert server_status(tmp_path)[0] is ServerStatus.NOT_ANSWERING


def test_local_config_is_valid_and_carries_the_compat_flags(tmp_path: Path) -> None:
    path = tmp_path / "tether.toml"
    written = write_local_config(
        path,
        "http://127.0.0.1:18080/v1",
        ledger_url=f"sqlite:{tmp_path}/ledger.db",
        budget_bytes=9000,
        agent="helper",
        summary_max_bytes=1500,
    )
    config = load_config(path)
    assert written == config
    provider = config.provider("local")
    assert provider.base_url == "http://127.0.0.1:18080/v1"
    assert provider.api == "openai-completions"
    assert provider.compat == LOCAL_COMPAT
    assert provider.context_window == 8192
    assert config.followup.budget_bytes == 9000
    agent = config.agent("helper")
    assert (agent.provider, agent.model, agent.effort) == ("local", "smollm2", "off")
    assert agent.summary_max_bytes == 1500


def test_a_clock_step_does_not_make_a_recorded_server_stale(
    tmp_path: Path, group: tuple[subprocess.Popen[bytes], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a clock step the kernel reports a boot time moved by the step (it recomputes it from
    # the clock on every read), while the process is the same one: it must still be found.
    proc, _ = group
    write_state(state_for(proc.pid, tmp_path, port=9), tmp_path)
    booted = psutil.boot_time()
    monkeypatch.setattr(psutil, "boot_time", lambda: booted + 30.0)
    assert server_status(tmp_path)[0] is ServerStatus.NOT_ANSWERING
    outcome, _ = stop_recorded(tmp_path, grace=5.0)
    assert outcome is StopOutcome.STOPPED
    assert proc.wait(timeout=5) != 0
