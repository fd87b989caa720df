"""The keeper: a small process that owns pi so a run outlives its harness (DESIGN §3.7).

    python keeper.py RUN_DIR STDERR_LOG -- PI_ARGV...

Started by :class:`tether.pi.detached.KeeperTransport` in a session of its own, it

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

It imports nothing beyond the standard library (it runs as ``python -I -S keeper.py``, so it
starts fast) and never parses the protocol beyond spotting its own control line. Linux only
(``prctl``, ``/proc``), like the rest of custody.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

FIFO_NAME = "commands.fifo"
EVENTS_NAME = "events.jsonl"
PLACEMENT_NAME = "keeper.json"
EXIT_NAME = "exit.json"
CONTROL_TYPE = "tether_keeper"
CLOSE_STDIN = b'{"type":"tether_keeper","op":"close_stdin"}'
_PR_SET_CHILD_SUBREAPER = 36
_CHUNK = 256 * 1024


def _write_atomic(path: Path, data: dict[str, object]) -> None:
    # Renamed into place, not synced: these records matter while the host is up (a host that
    # goes down takes pi with it), and a sync costs a run dearly on a busy disk.
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _relay(fifo_fd: int, pi: subprocess.Popen[bytes]) -> None:
    """FIFO lines → pi's stdin, until pi's stdin is closed or broken."""
    assert pi.stdin is not None
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
                with contextlib.suppress(OSError):
                    pi.stdin.close()
                return
            try:
                pi.stdin.write(line + b"\n")
                pi.stdin.flush()
            except (OSError, ValueError):
                return


def _children(me: int) -> list[int]:
    """Pids whose parent is ``me`` (from ``/proc``; the keeper reaps what it kills, so a pid
    found here is ours until we reap it)."""
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
    for _ in range(200):
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        left = _children(me)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: keeper.py RUN_DIR STDERR_LOG -- PI_ARGV...", file=sys.stderr)
        return 2
    run_dir, log_path, pi_argv = Path(argv[0]), Path(argv[1]), argv[3:]
    # The harness's hangup or terminal signals are not ours: only pi's end ends the keeper.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    subreaper = _become_subreaper()
    fifo = run_dir / FIFO_NAME
    with contextlib.suppress(FileNotFoundError):
        fifo.unlink()
    os.mkfifo(fifo, 0o600)
    fifo_fd = os.open(fifo, os.O_RDWR)
    events = open(run_dir / EVENTS_NAME, "ab")  # noqa: SIM115  (held for the keeper's life)
    log = open(log_path, "ab")  # noqa: SIM115
    pi = subprocess.Popen(
        pi_argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,  # its own group, so a stop reaches what it starts
    )
    me = os.getpid()
    _write_atomic(
        run_dir / PLACEMENT_NAME, {"keeper_pid": me, "pi_pid": pi.pid, "subreaper": subreaper}
    )
    threading.Thread(target=_relay, args=(fifo_fd, pi), daemon=True).start()
    assert pi.stdout is not None
    out_fd = pi.stdout.fileno()
    while True:
        try:
            chunk = os.read(out_fd, _CHUNK)
        except OSError:
            break
        if not chunk:
            break
        events.write(chunk)
        events.flush()
    status = pi.wait()
    _end_everything(me)
    events.close()
    log.close()
    _write_atomic(run_dir / EXIT_NAME, {"status": status, "at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
