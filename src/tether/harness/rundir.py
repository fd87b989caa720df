"""A run's directory (pi's agent dir, session file, log, private TMPDIR) and the agent's working
directory, kept apart: the agent's tools may read anything under their workdir, so it must not
contain the ledger, the config or the run directories (DESIGN §3.10). Run directories are
private (0700), removed when a run ends well and kept when it does not, and pruned by age."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tether.config import Config
from tether.errors import ConfigError
from tether.files import private_dir
from tether.harness.stranded import UNRECORDED_DIR
from tether.ledger import Ledger, RunStatus

__all__ = ["Pruned", "check_workdir", "make_run_dir", "prune_runs", "runs_dir"]


def runs_dir(config: Config) -> Path:
    """Where runs keep their directories (``harness.runs_dir``; relative to the config file)."""
    base = config.path.parent if config.path else Path.cwd()
    chosen = config.harness.runs_dir
    if chosen is None:
        return (base / ".tether" / "runs").resolve()
    return (chosen if chosen.is_absolute() else base / chosen).resolve()


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def check_workdir(workdir: Path, *, agent: str, config: Config, ledger: Ledger) -> Path:
    """``workdir`` resolved (and created if missing), or ``ConfigError`` (nothing written yet)
    when it contains what the agent's tools must not reach."""
    workdir = workdir.resolve()
    guarded = [
        ("the ledger", ledger.path),
        ("the config", config.path.resolve() if config.path else None),
        ("the run directories", runs_dir(config)),
    ]
    for what, path in guarded:
        if path is not None and _inside(path.resolve(), workdir):
            raise ConfigError(
                f"agent {agent!r} would work in {workdir}, which contains {what} ({path}): its "
                f"tools could read or change it. Set [agents.{agent}] workdir (or --workdir) to a "
                f"directory that does not contain it, or move {what} out of {workdir}"
            )
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def make_run_dir(config: Config, run_id: str) -> Path:
    """The run's private directory, with a private TMPDIR inside."""
    path = private_dir(runs_dir(config) / run_id)
    private_dir(path / "tmp")
    return path


@dataclass(frozen=True, slots=True)
class Pruned:
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
        if not path.is_dir() or path.stat().st_mtime > cutoff or path.name == UNRECORDED_DIR:
            continue  # (run ends the ledger could not take wait there to be recorded)
        run = ledger.run(path.name)
        if run is not None and run.status in (RunStatus.RUNNING, RunStatus.QUEUED):
            live.append(path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return Pruned(removed, live)
