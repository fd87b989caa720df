"""Filesystems a test makes for itself (the tests run as root, which writes through file modes:
a small or read-only filesystem is the way to deny it space or writes)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["files_under", "read_only", "tmpfs"]


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``4m``) mounted at ``where`` (made), unmounted at the end."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def read_only(mount: Path) -> None:
    """Make the filesystem mounted at ``mount`` read-only from now on."""
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)


def files_under(root: Path) -> list[Path]:
    """The regular files under ``root`` (none if it does not exist), with links to files (as
    ``Path.is_file`` takes them); links to directories are not walked.

    A finished run's directory is removed by an ``rm -rf`` that outlives the run
    (``tether.files.remove_later``), so directories may vanish during the walk: ``os.walk``
    skips what it can no longer list, where ``Path.rglob`` raises. FIFOs and sockets are left
    out (opening one to read would wait for a writer); a file may still vanish before it is read.
    """
    found = []
    for top, _, names in os.walk(root):
        for name in names:
            path = Path(top, name)
            if path.is_file():
                found.append(path)
    return found
