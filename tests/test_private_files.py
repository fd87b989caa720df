"""Everything tether causes to exist is private to its user whatever the umask: directories
0700, files 0600 (or 0700 for a program), under the usual umask 022 as under 000
(``tests/test_sandbox_escapes.py``): the state directory, the ledger, the compile cache and its
warm-up lock, the agent's workdir when tether makes it, the sessions' workspaces."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from provider import Reply, ScriptedProvider
from support.cli import run_args, tether
from support.config import workspace_tree, write_config


def made_under(root: Path) -> list[Path]:
    """``root`` and every directory and file under it (not links; what vanishes meanwhile, a
    finished run's directory being removed, is left out)."""
    found = [root]
    for top, dirs, files in os.walk(root):
        found += [Path(top) / name for name in dirs + files]
    return [p for p in found if p.exists() and not p.is_symlink()]


def test_under_umask_022_every_file_and_directory_tether_causes_is_private(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(lambda _req: Reply("ok"))
    cfg = write_config(tmp_path, p.url, harness={"runs_dir": "state/runs"})
    (tmp_path / "work").rmdir()  # tether makes it: the first session's template
    cache = tmp_path / "xdg-cache"
    for session, sandbox in (("s1", "bwrap"), ("s2", "none")):
        if sandbox == "none":
            cfg.write_text(
                cfg.read_text().replace('workdir = "work"', 'workdir = "work"\nsandbox = "none"')
            )
        done = tether(
            *run_args(cfg, "hi", session=session, as_json=True),
            cwd=tmp_path,
            umask=0o022,
            env={"XDG_CACHE_HOME": str(cache)},
        )
        assert done.returncode == 0, done.stderr
    assert (cache / "tether" / "node-compile-cache" / ".warm.lock").is_file()
    assert workspace_tree(tmp_path, "s1").is_dir()
    assert workspace_tree(tmp_path, "s2").is_dir()
    made = [
        *made_under(cache),
        *made_under(tmp_path / "state"),
        *tmp_path.glob("ledger.db*"),
        *made_under(tmp_path / ".tether"),
        *made_under(tmp_path / "work"),
    ]
    assert len(made) > 20, made
    loose = {
        str(q): oct(stat.S_IMODE(q.lstat().st_mode)) for q in made if q.lstat().st_mode & 0o077
    }
    assert loose == {}
