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
from tether.files import DISCARDED_DIR, ForeignFile, file_id, open_own, remove_later


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


# -- files tether reads where it keeps its own (open_own) ---------------------------------------


def _run_dir(root: Path) -> Path:
    """A run's directory as tether leaves it: private, its session file (``text``) through
    tether's own link into ``pi-session/``."""
    run = root / "r-1"
    (run / "pi-session").mkdir(parents=True, mode=0o700)
    run.chmod(0o700)
    (run / "pi-session" / "session.jsonl").write_text("tether's\n")
    (run / "session.jsonl").symlink_to(Path("pi-session") / "session.jsonl")
    return run


def test_a_file_of_tethers_is_read_and_its_own_link_taken_by_its_target(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    made = file_id(run / "pi-session" / "session.jsonl")
    with open_own(run / "session.jsonl", expect=made, link="pi-session/session.jsonl") as f:
        assert f.read() == b"tether's\n"
    (run / "custody.json").write_text("{}")
    with open_own(run / "custody.json") as f:
        assert f.read() == b"{}"


@pytest.mark.parametrize(
    "plant",
    ["link_elsewhere", "link_without_target", "relinked", "fifo", "hard_link", "replaced"],
)
def test_anything_else_in_its_place_is_never_read(tmp_path: Path, plant: str) -> None:
    run = _run_dir(tmp_path)
    session = run / "session.jsonl"
    real = run / "pi-session" / "session.jsonl"
    made = file_id(real)
    outside = tmp_path / "outside.jsonl"
    outside.write_text("SECRET\n")
    if plant == "link_elsewhere":
        session.unlink()
        session.symlink_to(outside)
    elif plant == "link_without_target":  # a link where the file itself is expected
        real.unlink()
        real.symlink_to(outside)
    elif plant == "relinked":  # tether's link, its directory swapped for a link outside
        (run / "pi-session").rename(run / "moved")
        (run / "pi-session").symlink_to(tmp_path)
        (tmp_path / "session.jsonl").write_text("SECRET\n")
    elif plant == "fifo":
        real.unlink()
        os.mkfifo(real, 0o600)
    elif plant == "hard_link":
        real.unlink()
        os.link(outside, real)
    else:  # another file by the same name (made first: a freed inode number is reused)
        (real.parent / "new").write_text("SECRET\n")
        os.replace(real.parent / "new", real)
    with pytest.raises(ForeignFile):
        open_own(session, expect=made, link="pi-session/session.jsonl")


def test_a_directory_others_may_enter_is_not_tethers(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    run.chmod(0o755)
    with pytest.raises(ForeignFile, match="not a private directory"):
        open_own(run / "session.jsonl", link="pi-session/session.jsonl")
    run.chmod(0o700)
    with pytest.raises(ForeignFile, match="symbolic link"):
        open_own(run / "session.jsonl")  # no link allowed: tether's own is not followed either
