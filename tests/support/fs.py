"""Filesystems a test makes for itself (the tests run as root, which writes through file modes:
a small or read-only filesystem is the way to deny it space or writes)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["read_only", "tmpfs"]


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
