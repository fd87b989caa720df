"""The keeper as its own process (``python -I -S``, as tether starts it): what it records, and
what it imports. Every run starts one, so its start is part of every run's CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tether.pi import keeper


def _run_keeper(tmp_path: Path, *pi: str) -> tuple[Path, str]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # The command tether starts it with, timing its imports (-X importtime, on its stderr).
    command = keeper.keeper_command(run_dir, tmp_path / "pi.log", list(pi))
    assert command[:3] == [sys.executable, "-I", "-S"]
    done = subprocess.run(
        [*command[:3], "-X", "importtime", *command[3:]],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir, done.stderr


def test_the_keeper_records_pi_and_its_exit_as_json_and_relays_its_output(
    tmp_path: Path,
) -> None:
    run_dir, _ = _run_keeper(tmp_path, "/bin/sh", "-c", "echo hello; exit 3")
    assert (run_dir / keeper.EVENTS_NAME).read_bytes() == b"hello\n"
    placement = keeper.read_placement(run_dir)
    assert placement is not None
    assert set(placement) == {"keeper_pid", "pi_pid", "subreaper"}
    assert isinstance(placement["keeper_pid"], int)
    assert isinstance(placement["pi_pid"], int)
    assert placement["keeper_pid"] != placement["pi_pid"]
    assert placement["subreaper"] is True
    ended = json.loads((run_dir / keeper.EXIT_NAME).read_text())
    assert ended["status"] == 3
    assert isinstance(ended["at"], float)


def test_the_keeper_imports_no_module_that_costs_more_than_its_work(tmp_path: Path) -> None:
    # json (with re and enum), signal (enum) and threading took 15 of the keeper's 36 ms of CPU
    # on a run of /bin/true; builtins (_signal, _thread) and its own writer do their work.
    _, stderr = _run_keeper(tmp_path, "/bin/true")
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", stderr, re.M))
    assert "os" in imported  # the listing is read right
    # Imported as a module (its cached bytecode), not run as a script (compiled at every start).
    assert "keeper" in imported
    assert not imported & {"json", "re", "enum", "signal", "threading", "typing"}, imported


@pytest.mark.parametrize(
    "record",
    [
        {"keeper_pid": 1, "pi_pid": 2**22, "subreaper": True},
        {"keeper_pid": 7, "pi_pid": 8, "subreaper": False},
        {"status": -9, "at": 1796312193.0219207},
        {"status": 0, "at": 1e-7},
        {"status": 255, "at": 12.0},
    ],
)
def test_the_keepers_records_are_json(record: dict[str, int | float | bool]) -> None:
    text = keeper._json_object(record)
    assert json.loads(text) == record
    assert [type(v) for v in json.loads(text).values()] == [type(v) for v in record.values()]
