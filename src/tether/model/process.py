"""Starting, finding and stopping the embedded model server.

The server runs in its own process group (``python -m tether.model.server``), on a socket this
process binds on 127.0.0.1 and hands over, so the port is known and held before the model loads.
A server started in the background is recorded in ``<state_dir>/model.json`` (pid, port, and the
process's start time, so a later ``tether model stop`` never signals a process that merely
reuses the pid). Stopping escalates SIGTERM → grace → SIGKILL to the whole group, and a child is
always reaped.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from pydantic import BaseModel, ConfigDict

from tether.errors import ModelError
from tether.model.weights import DEFAULT_MODEL, INSTALL_HINT, find_model, server_available

__all__ = [
    "DEFAULT_STATE_DIR",
    "ModelServer",
    "ServerState",
    "ServerStatus",
    "StopOutcome",
    "clear_state",
    "probe",
    "read_state",
    "server_status",
    "stop_recorded",
    "write_state",
]

DEFAULT_STATE_DIR = Path(".tether")
STATE_FILE = "model.json"
LOG_FILE = "model.log"
READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0
_POLL_S = 0.05
# Probes never go through a proxy: the server is on loopback.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerStatus(enum.Enum):
    RUNNING = "running"
    """Recorded, the same process is alive, and it answers."""
    NOT_ANSWERING = "not_answering"
    """Recorded and alive, but it does not answer (still loading, or wedged)."""
    STALE = "stale"
    """Recorded, but that process is gone (or the pid now belongs to another process)."""
    NOT_RUNNING = "not_running"
    """Nothing recorded."""


class StopOutcome(enum.Enum):
    STOPPED = "stopped"
    STALE = "stale"
    NOT_RUNNING = "not_running"


class ServerState(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int
    port: int
    model: str
    alias: str
    started_at: float
    proc_start: int
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    log: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _proc_start(pid: int) -> int | None:
    """The start time of ``pid``, or None if there is no such (live) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    # fields[0] is field 3 (state); a zombie has exited already.
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _same_process(state: ServerState) -> bool:
    return _proc_start(state.pid) == state.proc_start


def probe(base_url: str, timeout: float = 5.0) -> list[str] | None:
    """The model ids the server lists, or None when it does not answer."""
    try:
        with _opener.open(f"{base_url}/models", timeout=timeout) as response:
            body = json.load(response)
    except (OSError, ValueError):
        return None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [str(m.get("id")) for m in data if isinstance(m, dict)]


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise ModelError(
            f"cannot listen on 127.0.0.1:{port}: {exc}; choose another --port (or 0 for any)"
        ) from exc
    return sock


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class ModelServer:
    """A running model server this process started (a context manager that stops it)."""

    def __init__(self, proc: subprocess.Popen[bytes], state: ServerState) -> None:
        self._proc = proc
        self.state = state

    @property
    def base_url(self) -> str:
        return self.state.base_url

    @property
    def pid(self) -> int:
        return self.state.pid

    @classmethod
    def start(
        cls,
        *,
        log_path: Path,
        port: int = 0,
        model_path: Path | None = None,
        alias: str = DEFAULT_MODEL.name,
        n_ctx: int = DEFAULT_MODEL.context_window,
        threads: int | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> ModelServer:
        """Start the server and wait until it answers; on any failure nothing is left running."""
        if not server_available():
            raise ModelError(f"llama-cpp-python's server is not installed; {INSTALL_HINT}")
        model = model_path or find_model()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        sock = _bind(port)
        argv = [
            sys.executable,
            "-m",
            "tether.model.server",
            "--fd",
            str(sock.fileno()),
            "--model",
            str(model),
            "--alias",
            alias,
            "--ctx",
            str(n_ctx),
            "--threads",
            str(threads or os.cpu_count() or 1),
        ]
        env = {
            # llama.cpp's OpenMP threads busy-wait by default; on a shared, loaded machine the
            # spinning starves the threads doing the work and a reply takes several times longer.
            "OMP_WAIT_POLICY": "PASSIVE",
            **os.environ,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        try:
            with log_path.open("ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(sock.fileno(),),
                    start_new_session=True,
                    env=env,
                )
        finally:
            # The child holds its own copy; ours would only keep the port after it exits.
            actual_port = sock.getsockname()[1]
            sock.close()
        state = ServerState(
            pid=proc.pid,
            port=actual_port,
            model=str(model),
            alias=alias,
            started_at=time.time(),
            proc_start=_proc_start(proc.pid) or 0,
            log=str(log_path),
        )
        server = cls(proc, state)
        try:
            server._wait_ready(ready_timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ModelError(
                    f"the model server exited with status {self._proc.returncode} before it "
                    f"answered; its log ({self.state.log}) ends with:\n"
                    f"{_log_tail(Path(self.state.log))}"
                )
            if probe(self.base_url, timeout=min(5.0, max(0.1, deadline - time.monotonic()))):
                return
            time.sleep(0.2)
        raise ModelError(
            f"the model server did not answer within {timeout:.0f} s; see {self.state.log}"
        )

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait(self) -> int:
        """Block until the server exits on its own (it does not, unless it fails)."""
        return self._proc.wait()

    def detach(self) -> ServerState:
        """Leave the server running after this process exits (its state is the handle)."""
        # Popen would warn that it is still running; the state file takes over from here.
        self._proc.returncode = 0
        return self.state

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM the group, wait up to ``grace``, SIGKILL it, and reap the child."""
        pid = self._proc.pid
        if self._proc.returncode is None:
            _signal_group(pid, signal.SIGTERM)
            if not _wait_exited_child(pid, grace):
                _signal_group(pid, signal.SIGKILL)
            # The leader is a zombie now, so its pid (the group id) cannot be reused yet: the
            # last SIGKILL reaches only stragglers of this group.
            _signal_group(pid, signal.SIGKILL)
        self._proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _wait_exited_child(pid: int, timeout: float) -> bool:
    """Wait (without reaping) until child ``pid`` has exited; False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


# --- the state file of a background server ---------------------------------------------------


def read_state(state_dir: Path = DEFAULT_STATE_DIR) -> ServerState | None:
    path = state_dir / STATE_FILE
    try:
        return ServerState.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}; delete it if no server is running") from exc


def write_state(state: ServerState, state_dir: Path = DEFAULT_STATE_DIR) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path


def clear_state(state_dir: Path = DEFAULT_STATE_DIR) -> None:
    (state_dir / STATE_FILE).unlink(missing_ok=True)


def server_status(state_dir: Path = DEFAULT_STATE_DIR) -> tuple[ServerStatus, ServerState | None]:
    state = read_state(state_dir)
    if state is None:
        return ServerStatus.NOT_RUNNING, None
    if not _same_process(state):
        return ServerStatus.STALE, state
    if probe(state.base_url) is None:
        return ServerStatus.NOT_ANSWERING, state
    return ServerStatus.RUNNING, state


def stop_recorded(
    state_dir: Path = DEFAULT_STATE_DIR, grace: float = STOP_GRACE_S
) -> tuple[StopOutcome, ServerState | None]:
    """Stop the server recorded in ``state_dir`` (started by another process) and forget it."""
    state = read_state(state_dir)
    if state is None:
        return StopOutcome.NOT_RUNNING, None
    if not _same_process(state):
        clear_state(state_dir)
        return StopOutcome.STALE, state
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        # Check identity before every signal: never signal a process that reused the pid.
        if not _same_process(state):
            break
        _signal_group(state.pid, sig)
        deadline = time.monotonic() + wait
        while _same_process(state) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
    if _same_process(state):
        raise ModelError(
            f"the model server (pid {state.pid}) survived SIGKILL; check `ps -o stat {state.pid}`"
        )
    clear_state(state_dir)
    return StopOutcome.STOPPED, state
