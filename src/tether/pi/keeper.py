"""The keeper: a small process that owns pi so a run outlives its harness
(docs/architecture.md#custody).

    python keeper.py RUN_DIR STDERR_LOG -- PI_ARGV...

Started by :class:`tether.pi.detached.KeeperTransport` in a session of its own, it

- starts pi in a session and group of its own (a sandboxed pi's command, the provider forwarder
  ``sandbox/outside.py``, in a fork of itself: its bytecode loads faster than a second
  interpreter starts);
- makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so the tools pi starts
  are reparented to it, not to init, when pi dies;
- creates the command FIFO ``RUN_DIR/commands.fifo`` (0600) and holds it open for reading and
  writing (a harness that goes away never makes it see end of file), relaying every line to
  pi's stdin; the line ``{"type":"tether_keeper","op":"close_stdin"}`` closes pi's stdin instead
  (pi's orderly shutdown);
- appends pi's stdout, byte for byte, to ``RUN_DIR/events.jsonl`` (a new harness reads it from
  any offset), and pi's stderr to STDERR_LOG;
- records where pi runs in ``RUN_DIR/keeper.json`` (its own pid and pi's; the harness adds their
  start times, which it reads while the keeper, pi's parent, keeps pi's pid from being reused);
- when pi exits, kills every process left under it (its tools), reaps them, and writes
  ``RUN_DIR/exit.json`` with pi's exit status last: once that file exists the events file is
  complete.

It imports nothing beyond the standard library (it runs under ``python -I -S``, imported from
its cached bytecode, so it starts fast) and never parses the protocol beyond spotting its own
control line. Linux only (``prctl``, ``/proc``), like the rest of custody.
"""

from __future__ import annotations

# Only os, sys and _signal before pi is started: every import here delays pi's start (pi starts at
# once, with os.posix_spawn; the rest is imported while it loads).
import _signal  # type: ignore[import-not-found]  # (no stubs: the builtin under signal)
import os
import sys

TYPE_CHECKING = False  # typing itself takes longer to import than the keeper needs to start pi
if TYPE_CHECKING:
    import subprocess
    from pathlib import Path
    from typing import Any

FIFO_NAME = "commands.fifo"
EVENTS_NAME = "events.jsonl"
PLACEMENT_NAME = "keeper.json"
EXIT_NAME = "exit.json"
CONTROL_TYPE = "tether_keeper"
CLOSE_STDIN = b'{"type":"tether_keeper","op":"close_stdin"}'
_OUTSIDE = os.path.join("sandbox", "outside.py")
PASSED_FDS = ("TETHER_KEY_FD", "TETHER_GATE_FD")
UMASK_ENV = "TETHER_UMASK"
"""Variables naming descriptors the keeper hands on to pi (the key channel, the gate)."""
# The keeper runs as a module imported from its directory, not as a script: a script is compiled
# at every start (a third of the keeper's own instructions), a module loads its cached bytecode.
# The directory leaves sys.path at once: its other modules' names must not shadow the stdlib's.
_BOOT = (
    "import sys;sys.path.insert(0,sys.argv[1]);import keeper;del sys.path[0];"
    "keeper.run(sys.argv[2:])"
)
_PR_SET_CHILD_SUBREAPER = 36
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
_READ_OWN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 256 * 1024


def start(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    run_dir: Path,
    stderr_log: Path,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start a keeper running pi (``argv``) for ``run_dir``, in a session of its own: the
    harness's end is not its end. Raises ``OSError``."""
    import subprocess

    command = keeper_command(run_dir, stderr_log, argv)
    log = os.open(stderr_log, _APPEND, 0o600)
    try:
        os.fchmod(log, 0o600)
        return subprocess.Popen(
            command,
            env=env,
            cwd=str(cwd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    finally:
        os.close(log)


def keeper_command(run_dir: Path, stderr_log: Path, argv: list[str]) -> list[str]:
    """The keeper's command line, running pi (``argv``) for ``run_dir``."""
    here = os.path.dirname(os.path.abspath(__file__))
    command = [sys.executable, "-I", "-S", "-c", _BOOT, here, str(run_dir), str(stderr_log)]
    return [*command, "--", *argv]


def read_placement(run_dir: Path) -> dict[str, Any] | None:
    """What a keeper recorded in ``run_dir`` (its pid, pi's), or None."""
    import json
    import stat

    try:
        # Never through a link, nor from a file not this user's (a tool's, planted in its place).
        fd = os.open(os.path.join(run_dir, PLACEMENT_NAME), _READ_OWN)
        with open(fd, "rb") as f:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
                return None
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def signal_group(pid: int, sig: int) -> None:
    """Signal pi's process group (pi and the tools it started in it): the one place tether
    signals pi. The caller has confirmed ``pid`` still names pi (not reaped, or its start time
    matched): a reused pid is never signalled. A group already gone is no error."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _write_atomic(path: str, data: dict[str, int | float | bool]) -> None:
    # Renamed into place, not synced: these records matter while the host is up (a host that
    # goes down takes pi with it), and a sync costs a run dearly on a busy disk.
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_json_object(data))
    os.replace(tmp, path)


def _json_object(data: dict[str, int | float | bool]) -> str:
    """A record of numbers and booleans as a JSON object. The json module's import (with re
    and enum) took more of the keeper's CPU than the rest of its work; its records need none
    of it. Keys are the keeper's own names (no escaping needed); floats are finite."""
    fields = (
        f'"{key}": {("true" if value else "false") if isinstance(value, bool) else repr(value)}'
        for key, value in data.items()
    )
    return "{" + ", ".join(fields) + "}"


def _become_subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _relay(fifo_fd: int, stdin_fd: int) -> None:
    """FIFO lines → pi's stdin, until pi's stdin is closed or broken."""
    import time

    buf = b""
    while True:
        chunk = os.read(fifo_fd, _CHUNK)
        if not chunk:  # cannot happen while we hold a write end; be safe anyway
            time.sleep(0.05)
            continue
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip() == CLOSE_STDIN:
                try:
                    os.close(stdin_fd)
                except OSError:
                    pass
                return
            try:
                _write_all(stdin_fd, line + b"\n")
            except OSError:
                return


def _children(me: int) -> list[int]:
    """Pids whose parent is ``me`` (the keeper reaps what it kills, so a pid found here is ours
    until we reap it): from each of its threads' ``children`` list, or, on a kernel without
    those, from every process's ``stat``."""
    try:
        found: list[int] = []
        for task in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{task}/children", "rb") as f:
                found += [int(pid) for pid in f.read().split()]
        return found
    except OSError:
        pass
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(entry))
    return found


def _end_everything(me: int) -> None:
    """Kill and reap every process left under the keeper: pi's tools, reparented here when
    their parents die (the keeper is their subreaper), round after round until none is left."""
    import time

    for _ in range(200):
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        left = _children(me)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _start_pi(
    argv: list[str], stdin_r: int, stdout_w: int, log_fd: int, *, close: tuple[int, ...]
) -> int:
    """Start pi: its stdin and stdout the keeper's pipes, its stderr the log, in a session and
    group of its own (a stop reaches what it starts). A sandboxed pi's command is the provider
    forwarder (``python -I -S outside.py …``, which starts bubblewrap): that program runs in a
    fork of this one, since a second interpreter's start would delay pi's by as much again."""
    if argv[1:3] == ["-I", "-S"] and len(argv) > 3 and argv[3].endswith(_OUTSIDE):
        pid = os.fork()
        if pid != 0:
            return pid
        try:  # the child: pi's stdio and session, nothing else of the keeper's
            os.setsid()
            for fd, target in ((stdin_r, 0), (stdout_w, 1), (log_fd, 2)):
                os.dup2(fd, target)
            for fd in {*close, stdin_r, stdout_w, log_fd} - {0, 1, 2}:
                os.close(fd)  # (the key's and the gate's stay: they are the forwarder's and pi's)
            # Imported, not compiled here: its cached bytecode loads in a fraction of the time.
            sys.path.insert(0, os.path.dirname(argv[3]))
            outside = __import__("outside")
            del sys.path[0]
            status = outside.main(argv[4:])
        except BaseException as exc:
            os.write(2, f"tether: cannot start the sandbox's forwarder: {exc!r}\n".encode())
            status = 127
        sys.stderr.flush()
        os._exit(status)
    return os.posix_spawn(
        argv[0],
        argv,
        os.environ,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, stdin_r, 0),
            (os.POSIX_SPAWN_DUP2, stdout_w, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ],
        setsid=True,  # its own session and group, so a stop reaches what it starts
        # Python ignores these; pi gets them back at their defaults, as subprocess would do.
        # (_signal is the builtin under the signal module, which costs an enum import here.)
        setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),
    )


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: keeper.py RUN_DIR STDERR_LOG -- PI_ARGV...", file=sys.stderr)
        return 2
    run_dir, log_path, pi_argv = argv[0], argv[1], argv[3:]
    fifo = os.path.join(run_dir, FIFO_NAME)
    try:
        os.unlink(fifo)
    except FileNotFoundError:
        pass
    os.mkfifo(fifo, 0o600)
    fifo_fd = os.open(fifo, os.O_RDWR)
    # Private files (0600), whatever the umask: they hold what pi says and sees.
    events_fd = os.open(os.path.join(run_dir, EVENTS_NAME), _APPEND, 0o600)
    log_fd = os.open(log_path, _APPEND, 0o600)
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    # The key channel and the gate (inherited pipes, inheritable here) go on to pi; everything
    # the keeper opened itself is close-on-exec.
    named = (os.environ.get(name, "") for name in PASSED_FDS)
    passed = tuple(int(text) for text in named if text.isdigit())
    # pi starts under umask 077, so that what Node makes for tether before pi's code runs (its
    # compile cache's directories) is private whatever the user's umask; tether's gate gives
    # pi the user's own umask back (UMASK_ENV) once that is done, for the agent's files.
    umask = os.umask(0o077)
    os.environ[UMASK_ENV] = f"{umask:o}"
    own = (fifo_fd, events_fd, stdin_w, stdout_r)
    pi_pid = _start_pi(pi_argv, stdin_r, stdout_w, log_fd, close=own)
    for fd in (stdin_r, stdout_w, *passed):
        try:
            os.close(fd)
        except OSError:
            pass

    # pi is loading: now the rest, on builtins (_signal, _thread; the signal, threading and json
    # modules' imports cost the keeper more CPU than the rest of its work on a short run).
    import _thread
    import time

    # The harness's hangup or terminal signals are not ours: only pi's end ends the keeper.
    _signal.signal(_signal.SIGHUP, _signal.SIG_IGN)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    subreaper = _become_subreaper()
    me = os.getpid()
    _write_atomic(
        os.path.join(run_dir, PLACEMENT_NAME),
        {"keeper_pid": me, "pi_pid": pi_pid, "subreaper": subreaper},
    )
    _thread.start_new_thread(_relay, (fifo_fd, stdin_w))
    while True:
        try:
            chunk = os.read(stdout_r, _CHUNK)
        except OSError:
            break
        if not chunk:
            break
        _write_all(events_fd, chunk)
    status = os.waitstatus_to_exitcode(os.waitpid(pi_pid, 0)[1])
    _end_everything(me)
    os.close(events_fd)
    os.close(log_fd)
    _write_atomic(os.path.join(run_dir, EXIT_NAME), {"status": status, "at": time.time()})
    return 0


def run(argv: list[str]) -> None:
    """The keeper's process: :func:`main`, then its end. Everything is written and closed: it
    ends without the interpreter's teardown (its relay thread and modules), which the harness
    would otherwise wait for to reap the keeper."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
