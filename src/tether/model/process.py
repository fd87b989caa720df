"""Starting, finding and stopping the embedded model server.

The server runs in its own process group (``python -m tether.model.server``), on a socket this
process binds on 127.0.0.1 and hands over, so the port is known and held before the model loads.
A server started in the background is recorded in ``<state_dir>/model.json`` (pid, port, and the
process's start time, so a later ``tether model stop`` never signals a process that merely
reuses the pid). Stopping escalates SIGTERM → grace → SIGKILL to the server and its descendants
(psutil, which also checks each process's identity before it signals it), and a child of this
process is always reaped.
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
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil
from pydantic import BaseModel, ConfigDict

from tether.errors import ModelError
from tether.files import private_dir, private_file
from tether.model.weights import DEFAULT_MODEL, INSTALL_HINT, find_model, server_available
from tether.processes import alive, start_time

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
    proc_start: float
    """The process's start time in seconds since boot (:func:`tether.processes.start_time`, the
    kernel's own record): unlike the wall-clock start, a clock step does not move it."""
    log: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _live(pid: int) -> psutil.Process | None:
    """The process ``pid``, or None if there is none or it has exited (a zombie, not yet reaped)."""
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.NoSuchProcess:
        return None


def _recorded(state: ServerState) -> psutil.Process | None:
    """The recorded server's process, if it is still alive and is the same process."""
    # Taken before the check: if the recorded process is alive after it, the pid named that
    # process already when psutil took it (a pid names one process for that process's life).
    proc = _live(state.pid)
    return proc if proc is not None and alive(state.pid, state.proc_start) else None


def _same_process(state: ServerState) -> bool:
    return _recorded(state) is not None


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
        # Popen owns the child (exit status, reaping); psutil finds and signals its descendants.
        self._proc = proc
        self._process = psutil.Process(proc.pid)
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
        if not log_path.parent.exists():
            private_dir(log_path.parent)
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
            with private_file(log_path).open("ab") as log:
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
        # Not reaped yet, so the pid is still this child's; no start time: it has exited already.
        started = start_time(proc.pid)
        if started is None:  # a zombie until reaped here: nothing to record
            status = proc.wait()
            raise ModelError(
                f"the model server exited with status {status} before it answered; its log "
                f"({log_path}) ends with:\n{_log_tail(log_path)}"
            )
        state = ServerState(
            pid=proc.pid,
            port=actual_port,
            model=str(model),
            alias=alias,
            started_at=time.time(),
            proc_start=started,
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
        """SIGTERM the server and its descendants, wait up to ``grace``, SIGKILL the rest, and
        reap the child."""
        if self._proc.returncode is None:
            _escalate(_tree(self._process), grace, psutil.wait_procs)
            # psutil's wait reaped the child and kept its status; Popen would record 0.
            with contextlib.suppress(psutil.TimeoutExpired):
                self._proc.returncode = self._process.wait(timeout=0)
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


# --- stopping a process tree ------------------------------------------------------------------

Wait = Callable[[list[psutil.Process], float], tuple[list[psutil.Process], list[psutil.Process]]]


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    """``proc`` and its descendants, listed before any is signalled: a killed parent's children
    are reparented and would no longer be found."""
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return [proc]


def _escalate(procs: list[psutil.Process], grace: float, wait: Wait) -> list[psutil.Process]:
    """SIGTERM, wait up to ``grace``, SIGKILL the rest, wait up to ``grace``; the survivors.

    psutil checks each process's identity before signalling it, so a pid reused in between is
    never signalled.
    """
    alive = procs
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in alive:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
            except psutil.AccessDenied as exc:
                raise ModelError(
                    f"not allowed to signal pid {proc.pid} of the model server; "
                    "stop it as the user who started it"
                ) from exc
        _, alive = wait(alive, grace)
        if not alive:
            break
    return alive


def _wait_exited(
    procs: list[psutil.Process], timeout: float
) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """:func:`psutil.wait_procs` for processes this one must not reap (another process's
    children): an exited one is gone even while it waits, a zombie, for its parent to reap it."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return [p for p in procs if p not in alive], alive
        time.sleep(_POLL_S)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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
    if not state_dir.exists():
        private_dir(state_dir)
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    private_file(tmp).write_text(state.model_dump_json(indent=2) + "\n")
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
    proc = _recorded(state)
    if proc is None:
        clear_state(state_dir)
        return StopOutcome.STALE, state
    # The server is usually not this process's child (its starter exited): its parent reaps it.
    survivors = _escalate(_tree(proc), grace, _wait_exited)
    if proc in survivors:
        raise ModelError(
            f"the model server (pid {state.pid}) survived SIGKILL; check `ps -o stat {state.pid}`"
        )
    clear_state(state_dir)
    return StopOutcome.STOPPED, state
