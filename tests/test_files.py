"""Files tether creates (``tether.files``): private modes, and directories removed without
waiting for the disk."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import psutil
import pytest

from support import wait_for
from tether.files import DISCARDED_DIR, remove_later


def _tree(root: Path) -> Path:
    run = root / "r-1"
    for sub in ("agent", "tmp/jiti", "tmp/cache"):
        (run / sub).mkdir(parents=True)
        (run / sub / "file.json").write_text("{}")
    (run / "session.jsonl").write_text("{}\n" * 100)
    return run


def test_a_directory_removed_later_is_gone_by_its_name_at_once_and_from_the_disk_soon(
    tmp_path: Path,
) -> None:
    run = _tree(tmp_path)
    remove_later(run)
    assert not run.exists(), "the directory must be gone by its name when the call returns"
    aside = tmp_path / DISCARDED_DIR
    assert stat.S_IMODE(aside.stat().st_mode) == 0o700, "what waits to be removed stays private"
    wait_for(lambda: not (aside / run.name).exists(), 10, "the directory set aside to be removed")
    assert list(tmp_path.iterdir()) == [aside]


def test_without_rm_the_directory_is_removed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _tree(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    remove_later(run)
    assert not run.exists()
    assert list((tmp_path / DISCARDED_DIR).iterdir()) == []


def test_a_directory_that_cannot_be_set_aside_is_removed_where_it_is(tmp_path: Path) -> None:
    run = _tree(tmp_path)
    # A file where the set-aside directory would be: the rename cannot happen.
    (tmp_path / DISCARDED_DIR).write_text("in the way")
    remove_later(run)
    assert not run.exists()
    assert os.path.isfile(tmp_path / DISCARDED_DIR)


def test_a_process_that_lives_on_keeps_no_zombie_of_its_removals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[int] = []
    real_spawn = os.posix_spawnp

    def recording(*args: Any, **kwargs: Any) -> int:
        pid = real_spawn(*args, **kwargs)
        spawned.append(pid)
        return pid

    monkeypatch.setattr(os, "posix_spawnp", recording)
    remove_later(_tree(tmp_path))
    (pid,) = spawned

    def reaped() -> bool:
        try:
            psutil.Process(pid).status()  # (psutil looks; it never reaps)
        except psutil.NoSuchProcess:
            return True  # reaped: no zombie left
        return False

    wait_for(reaped, 10, f"the removal {pid} to be reaped")
