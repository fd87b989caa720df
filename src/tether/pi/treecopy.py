"""Copying and removing a directory tree without following a symbolic link in it: a session's
workspace made from its template, or from another session's (:mod:`tether.pi.workspace`), whose
files an agent may have replaced with links (to anything of this user's) while it was listed.

A copy keeps modes (less setuid and setgid: the copy is this user's, not the owner's) and
times, copies symbolic links as links, opens every directory and file ``O_NOFOLLOW`` (an entry
replaced by a link since it was listed is left out) and leaves out sockets and devices.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

from tether.errors import WorkspaceError
from tether.files import DIR_MODE

__all__ = ["clear_tree", "copy_tree", "remove_tree"]

_KEPT_BITS = 0o1777
"""Mode bits a copy keeps: not setuid or setgid."""
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def copy_tree(src: Path, dst: Path, *, skip: str | None = None) -> None:
    """Copy the contents of the directory ``src`` into ``dst`` (made 0700 if missing): modes
    (less setuid and setgid) and times kept, symbolic links copied as links, none followed,
    sockets and devices left out; ``skip``: a name left out at the top. Raises
    ``WorkspaceError``."""
    try:
        fd = os.open(src, _OPEN_DIR)
    except OSError as exc:
        raise WorkspaceError(f"cannot read {src}: {exc}") from exc
    try:
        if not dst.exists():
            os.mkdir(dst, DIR_MODE)
            os.chmod(dst, DIR_MODE)
        _copy_dir(fd, dst, skip)
    except OSError as exc:
        raise WorkspaceError(f"cannot copy {src} to {dst}: {exc}") from exc
    finally:
        os.close(fd)


def _copy_dir(src_fd: int, dst: Path, skip: str | None) -> None:
    with os.scandir(src_fd) as entries:
        found = [(e.name, e.stat(follow_symlinks=False)) for e in entries if e.name != skip]
    for name, st in found:
        target = dst / name
        kind = stat.S_IFMT(st.st_mode)
        times = (st.st_atime_ns, st.st_mtime_ns)
        if kind == stat.S_IFLNK:
            os.symlink(os.readlink(name, dir_fd=src_fd), target)
            os.utime(target, ns=times, follow_symlinks=False)
        elif kind == stat.S_IFDIR:
            try:
                sub = os.open(name, _OPEN_DIR, dir_fd=src_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    continue  # replaced by a link (or a file) since it was listed: not followed
                raise
            try:
                os.mkdir(target, DIR_MODE)
                _copy_dir(sub, target, None)
                os.chmod(target, stat.S_IMODE(st.st_mode) & _KEPT_BITS)
                os.utime(target, ns=times)
            finally:
                os.close(sub)
        elif kind == stat.S_IFREG:
            _copy_file(src_fd, name, target)
        elif kind == stat.S_IFIFO:
            os.mkfifo(target, stat.S_IMODE(st.st_mode) & _KEPT_BITS)
            os.utime(target, ns=times)
        # sockets and devices: left out


def _copy_file(src_fd: int, name: str, target: Path) -> None:
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=src_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return  # replaced by a link since it was listed: not followed
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        os.set_blocking(fd, True)
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with open(fd, "rb", closefd=False) as fi, open(out, "wb", closefd=False) as fo:
                shutil.copyfileobj(fi, fo, 1 << 20)
            os.fchmod(out, stat.S_IMODE(st.st_mode) & _KEPT_BITS)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def clear_tree(tree: Path, *, keep: str) -> None:
    """Remove everything in ``tree`` but ``keep`` (links removed, not followed)."""
    with os.scandir(tree) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries if e.name != keep]
    for name, is_dir in names:
        if is_dir:
            if not remove_tree(tree / name):
                raise WorkspaceError(f"cannot remove {tree / name}")
        else:
            os.unlink(tree / name)


def remove_tree(path: Path) -> bool:
    """Remove ``path`` and everything in it, its directories made writable first when their
    modes keep their entries in (a copy keeps a template's read-only directories; an agent may
    chmod its own); links are removed, never followed. Whether it is gone; never raises."""
    if os.path.islink(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return not os.path.lexists(path)
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return True
    for top, dirs, _ in os.walk(path):  # does not follow links to directories
        for name in [top, *(os.path.join(top, d) for d in dirs)]:
            if not os.path.islink(name):
                with contextlib.suppress(OSError):
                    os.chmod(name, DIR_MODE)
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)
