"""pi started ahead of its run and held at its gate (``tether.pi.launch``, ``tether.pi.gate``),
with the real pi under its real keeper: it reads and writes nothing until it is let through,
and a run that never starts leaves neither a process nor a directory."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from support import Reply, ScriptedProvider, load_test_config, wait_for
from tether.config import Config
from tether.followup import Refused
from tether.harness.run import run_claimed
from tether.ledger import NewRow, RowKind, RunStatus, open_ledger
from tether.pi import keeper
from tether.pi.gate import WITHDRAWN_STATUS
from tether.pi.install import find_pi
from tether.pi.launch import PiLaunch, runs_dir


def make_config(tmp_path: Path, url: str, *, budget: int = 240_000) -> Config:
    return load_test_config(
        tmp_path,
        url,
        followup={"budget_bytes": budget},
        providers={"local": {"context_window": 64000}},
    )


def placement(run_dir: Path) -> dict[str, int]:
    data: dict[str, int] = json.loads((run_dir / keeper.PLACEMENT_NAME).read_text())
    return data


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def config(tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]) -> Config:
    return make_config(tmp_path, scripted_provider([Reply("hello")]).url)


def launch(config: Config, tmp_path: Path, run_id: str) -> PiLaunch:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    return PiLaunch.start(config, "rev", pi=find_pi(), run_id=run_id, workdir=workdir)


def test_pi_does_nothing_at_its_gate_until_it_is_let_through(
    config: Config, tmp_path: Path
) -> None:
    held = launch(config, tmp_path, "r-held")
    run_dir = held.run_dir
    wait_for(lambda: (run_dir / keeper.PLACEMENT_NAME).exists(), 10, "the keeper to start pi")
    pi_pid = placement(run_dir)["pi_pid"]
    fifo = os.open(run_dir / keeper.FIFO_NAME, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fifo, b'{"id":"s1","type":"get_state"}\n')
        # Long past pi's usual start: it is alive, and has answered nothing and opened no
        # session file.
        time.sleep(2.0)
        assert alive(pi_pid)
        assert (run_dir / keeper.EVENTS_NAME).read_bytes() == b""
        assert not (run_dir / "session.jsonl").exists()

        held.release()
        wait_for(
            lambda: b'"id":"s1"' in (run_dir / keeper.EVENTS_NAME).read_bytes(),
            20,
            "pi's answer once let through",
        )
        os.write(fifo, keeper.CLOSE_STDIN + b"\n")
    finally:
        os.close(fifo)
    assert held.keeper.wait(timeout=20) == 0
    assert json.loads((run_dir / keeper.EXIT_NAME).read_text())["status"] == 0


def test_a_discarded_launch_ends_pi_at_its_gate_and_removes_its_directory(
    config: Config, tmp_path: Path
) -> None:
    held = launch(config, tmp_path, "r-discarded")
    wait_for(lambda: (held.run_dir / keeper.PLACEMENT_NAME).exists(), 10, "the keeper")
    pids = placement(held.run_dir)
    started = time.monotonic()
    held.discard(grace_s=10)
    assert time.monotonic() - started < 5
    assert held.keeper.returncode == 0
    assert not alive(pids["pi_pid"])
    assert not held.run_dir.exists()
    assert list(runs_dir(config).iterdir()) == []
    held.release()  # too late: nothing to let through
    assert not held.released


def test_pi_at_its_gate_ends_when_the_process_that_started_it_dies(
    config: Config, tmp_path: Path
) -> None:
    # A harness (here a small Python process) starts pi and is killed with SIGKILL before it
    # lets pi through: the gate's end of file ends pi, and its keeper records why.
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from tether.config import load_config
        from tether.pi.install import find_pi
        from tether.pi.launch import PiLaunch
        (Path({str(tmp_path)!r}) / "work").mkdir(exist_ok=True)
        held = PiLaunch.start(load_config(Path({str(config.path)!r})), "rev", pi=find_pi(),
                              run_id="r-orphan", workdir=Path({str(tmp_path)!r}) / "work")
        print(held.run_dir, flush=True)
        time.sleep(600)
        """
    )
    src = str(Path(__file__).resolve().parent.parent / "src")
    harness = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert harness.stdout is not None
    run_dir = Path(harness.stdout.readline().strip())
    wait_for(lambda: (run_dir / keeper.PLACEMENT_NAME).exists(), 10, "the keeper")
    pids = placement(run_dir)
    harness.send_signal(signal.SIGKILL)
    harness.wait(timeout=10)
    wait_for(lambda: (run_dir / keeper.EXIT_NAME).exists(), 20, "pi to end at its gate")
    assert json.loads((run_dir / keeper.EXIT_NAME).read_text())["status"] == WITHDRAWN_STATUS
    wait_for(lambda: not alive(pids["keeper_pid"]), 10, "the keeper to end")
    assert not alive(pids["pi_pid"])
    assert not (run_dir / "session.jsonl").exists()


def test_a_workers_run_refused_before_it_started_leaves_no_pi_and_no_directory(
    tmp_path: Path,
    scripted_provider: Callable[..., ScriptedProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker claims a run and starts its pi at once; the view is then refused (its previous
    # request alone is over a tiny budget): the run fails "refused before it started", and the
    # pi that loaded meanwhile is ended at its gate with its directory.
    config = make_config(tmp_path, scripted_provider([Reply("hello")]).url, budget=2_000)
    with open_ledger(config.ledger.url) as ledger:
        ledger.ensure_session("s1")
        first = ledger.create_run("s1", "rev")
        fence = ledger.claim_run(first.id)
        request = {"role": "user", "content": [{"type": "text", "text": "x" * 3_000}]}
        ledger.append(
            fence, [NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=request)], request=True
        )
        ledger.end_run(fence, RunStatus.FINISHED)
        queued, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="and now?")
        claimed = ledger.claim_next(owner="worker", lease_s=30)
        assert claimed is not None
        assert claimed.run == queued.id

        launched: list[PiLaunch] = []
        start = PiLaunch.start

        def spy(*args: Any, **kwargs: Any) -> PiLaunch:
            launched.append(start(*args, **kwargs))
            return launched[-1]

        monkeypatch.setattr(PiLaunch, "start", spy)
        with pytest.raises(Refused):
            anyio.run(functools.partial(run_claimed, ledger, config, claimed))
        # pi was started, then ended at its gate (its keeper saw it end) and never let through.
        (held,) = launched
        assert held.keeper.returncode == 0
        assert not held.released

        run = ledger.get_run(queued.id)
        assert run.status is RunStatus.FAILED
        assert "refused before it started" in run.extra["error"]
    assert not (runs_dir(config) / queued.id).exists()
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(runs_dir(config)) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []
