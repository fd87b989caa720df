"""Files tether creates are private to their user: directories 0700, files 0600, whatever the
umask (docs/security.md). Transcripts, logs and the ledger hold what the agents read."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

__all__ = [
    "DIR_MODE",
    "DISCARDED_DIR",
    "FILE_MODE",
    "FileId",
    "ForeignFile",
    "file_id",
    "open_own",
    "private_dir",
    "private_file",
    "remove_later",
]

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


FileId = tuple[int, int]
"""A file's ``(st_dev, st_ino)``: which file it is, whatever name it has now."""


class ForeignFile(OSError):
    """A file tether reads where it keeps its own (a run's directory) that is not the one it
    made: a symbolic link, not a regular file, another user's, linked from elsewhere too, in a
    directory others may enter, or another file than the one recorded when tether made it. Such
    a file is never read."""


def file_id(path: Path) -> FileId:
    found = os.stat(path)
    return found.st_dev, found.st_ino


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking: a FIFO planted in a file's place opens at once (and is refused), not never.
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def _own_dir(name: str | Path, shown: Path, dir_fd: int | None = None) -> int:
    """A private directory of this user's, opened without following a link at its name."""
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ForeignFile(
                f"{shown} is not a directory tether made (a symbolic link?)"
            ) from None
        raise
    found = os.fstat(fd)
    if found.st_uid != os.geteuid() or found.st_mode & 0o077:
        os.close(fd)
        raise ForeignFile(f"{shown} is not a private directory of this user's: nothing read in it")
    return fd


def open_own(path: Path, *, expect: FileId | None = None, link: str | None = None) -> BinaryIO:
    """``path`` opened for reading, never through a symbolic link (``O_NOFOLLOW``): it must be a
    regular file of this user's with no other hard link, in a directory of this user's that no
    one else may enter (0700), and, given ``expect``, the very file tether made (same device and
    inode). ``link`` is the one target ``path`` may link to: tether's own link, taken by its known
    target (a relative path), never followed; the target is opened by name, each directory on
    the way under the same checks. Raises ``ForeignFile`` (nothing was read) or another
    ``OSError`` (``FileNotFoundError``: nothing there)."""
    directory = _own_dir(path.parent, path.parent)
    try:
        name, where = path.name, path.parent
        if link is not None:
            try:
                target: str | None = os.readlink(name, dir_fd=directory)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: not a link, the file itself
                    raise
                target = None
            if target is not None:
                if target != link:
                    raise ForeignFile(
                        f"{path} is a symbolic link to {target!r}, not tether's own "
                        f"({link!r}): not followed"
                    )
                *parts, name = PurePosixPath(link).parts
                for part in parts:
                    where = where / part
                    inner = _own_dir(part, where, dir_fd=directory)
                    os.close(directory)
                    directory = inner
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=directory)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ForeignFile(f"{where / name} is a symbolic link: not followed") from None
            raise
    finally:
        os.close(directory)
    found = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(found.st_mode):
        problem = "is not a regular file"
    elif found.st_uid != os.geteuid():
        problem = "belongs to another user"
    elif found.st_nlink != 1:
        problem = f"has {found.st_nlink} hard links"
    elif expect is not None and (found.st_dev, found.st_ino) != tuple(expect):
        problem = "is not the file tether made (it was replaced)"
    if problem is not None:
        os.close(fd)
        raise ForeignFile(f"{where / name} {problem}: not read")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


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
