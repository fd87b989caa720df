"""A run's directory (pi's agent dir, session file, log, private TMPDIR), kept apart from where
the agent's tools work (:mod:`tether.pi.workspace`, which refuses a workdir holding the ledger,
the config, the run directories or the workspaces). Run directories are private (0700),
removed when a run ends well (set aside at once, removed in the background:
:func:`tether.files.remove_later`) and kept when it does not, and pruned by age."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import msgspec

from tether.config import Config
from tether.files import DISCARDED_DIR
from tether.harness.stranded import UNRECORDED_DIR
from tether.ledger import Ledger, RunStatus
from tether.pi.launch import make_run_dir, runs_dir

__all__ = ["Pruned", "make_run_dir", "prune_runs", "runs_dir"]


class Pruned(msgspec.Struct, frozen=True):
    removed: list[Path]
    kept_live: list[Path]


def prune_runs(config: Config, ledger: Ledger, *, older_than_s: float) -> Pruned:
    """Remove run directories not touched for ``older_than_s`` whose run is not live."""
    root = runs_dir(config)
    cutoff = time.time() - older_than_s
    removed: list[Path] = []
    live: list[Path] = []
    if not root.is_dir():
        return Pruned(removed, live)
    for path in sorted(root.iterdir()):
        if path.name == DISCARDED_DIR:
            # Directories of runs that ended well, set aside to be removed: whatever is left
            # there (a removal cut short) goes now, whatever its age. Not counted: those runs'
            # directories were removed when they ended.
            for left in sorted(path.iterdir()):
                shutil.rmtree(left, ignore_errors=True)
            continue
        if not path.is_dir() or path.stat().st_mtime > cutoff or path.name == UNRECORDED_DIR:
            continue  # (run ends the ledger could not take wait there to be recorded)
        run = ledger.run(path.name)
        if run is not None and run.status in (RunStatus.RUNNING, RunStatus.QUEUED):
            live.append(path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return Pruned(removed, live)
