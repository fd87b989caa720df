"""Files tether creates are private to their user: directories 0700, files 0600, whatever the
umask (DESIGN §3.10). Transcripts, logs and the ledger hold what the agents read."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["DIR_MODE", "DISCARDED_DIR", "FILE_MODE", "private_dir", "private_file", "remove_later"]

DIR_MODE = 0o700
FILE_MODE = 0o600
DISCARDED_DIR = ".discarded"
"""Where :func:`remove_later` sets a directory aside, beside it, while it is being removed."""


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) as 0700; an existing one is left as it is, except
    the last component, which tether owns."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(directory, DIR_MODE)  # mkdir's mode is filtered by the umask
    if path.exists() and path not in missing:
        os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty as 0600 if it does not exist, and make it 0600 if it does."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def remove_later(path: Path) -> None:
    """Remove the directory ``path`` without waiting for the disk: it is renamed at once into
    ``.discarded/`` beside it (one rename: from now on nothing finds it by its name), then
    removed by an ``rm -rf`` of its own, which outlives this process. Removing a directory takes
    the filesystem's time for each directory in it (about 4 ms per ``rmdir`` on this project's
    machines, whose disk is mounted with ``discard``: 15 to 25 ms for a run directory), which a
    run's end need not wait for. Where neither can be done, it is removed here. Never raises."""
    import shutil
    import threading

    aside = path.parent / DISCARDED_DIR / path.name
    try:
        private_dir(aside.parent)
        os.rename(path, aside)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            pid = os.posix_spawnp(
                "rm",
                ["rm", "-rf", "--", str(aside)],
                os.environ,
                file_actions=[(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)],
                setsid=True,
            )
        finally:
            os.close(devnull)
    except OSError:
        shutil.rmtree(aside, ignore_errors=True)
        return
    # Reaped when it ends, so a process that lives on (a worker) keeps no zombie; a process that
    # ends first leaves it to init.
    threading.Thread(target=_reap, args=(pid,), daemon=True).start()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
