"""A throwaway unprivileged user, as real users run tether (CI runs as root, which the process
limit exempts and which reads every file)."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["unprivileged"]


@contextlib.contextmanager
def unprivileged(prefix: str = "tether-user-") -> Iterator[tuple[Path, int, str]]:
    """A directory for a throwaway user (or for us, already unprivileged), its uid and name.
    The directory is not under pytest's temporary root, which is root's alone (0700); the
    caller chowns what it puts there. Every process of that user ends with it."""
    if os.geteuid() != 0:
        user = pwd.getpwuid(os.getuid()).pw_name
    else:
        user = f"tsb{secrets.token_hex(3)}"
        subprocess.run(["useradd", "--no-create-home", user], check=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    uid = pwd.getpwnam(user).pw_uid
    try:
        yield tmp, uid, user
    finally:
        if os.geteuid() == 0:
            import psutil

            for proc in psutil.process_iter(["uids"]):  # the throwaway user's, by pid
                if proc.info["uids"] and proc.info["uids"].real == uid:
                    with contextlib.suppress(psutil.Error):
                        proc.kill()
            subprocess.run(["userdel", user], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
