"""The recovery paths keep custody's promises (DESIGN §3.7, invariants 14-16): a takeover's old
harness, a missing FIFO found at recovery, a dead keeper, a checkpoint a lost harness sent. The
real pi under its keeper, the scripted provider, real signals (SIGKILL, SIGSTOP)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import psutil

from provider import ScriptedProvider
from test_custody_run import (
    by_request,
    keeper_placement,
    running_run,
    start,
    store,
    tether,
    wait_until,
    write_config,
)
from tether.ledger import Ledger, RunStatus

__all__ = ["store"]  # the fixture, shared with test_custody_run


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_old_harness_says_it_was_taken_over_and_exits_5(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness stops (SIGSTOP) past its lease; ``tether recover`` takes the run over and
    finishes it on the same pi. Continued, the old ``tether run`` does not report the run as
    failed: it names the takeover and the new owner, prints the run's status in the ledger
    now, and exits 5 (docs/cli.md)."""
    in_tool = tmp_path / "in-tool"
    provider = scripted_provider(by_request(lambda asked: f"touch {in_tool}; sleep 4; echo slept"))
    cfg = write_config(tmp_path, provider.url, lease_s=2)
    old = start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "A")
    try:
        wait_until(lambda: running_run(store, "s1"), what="the run")
        run = running_run(store, "s1")
        assert run is not None
        keeper_placement(store, run.id)
        wait_until(in_tool.exists, what="the bash tool to run")
        old.send_signal(signal.SIGSTOP)
        wait_until(lambda: store.expired_leases(session="s1"), within=20, what="the lease to lapse")
        done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
        assert done.returncode == 0, done.stderr
        [item] = [json.loads(line) for line in done.stdout.splitlines()]
        assert item["resolution"] == "resumed"
        assert item["outcome"]["status"] == "finished"
        ended = store.get_run(run.id)
        assert ended.status is RunStatus.FINISHED
        assert ended.extra["answer"] == "answer to A"
    finally:
        old.send_signal(signal.SIGCONT)
    out, err = old.communicate(timeout=60)
    assert old.returncode == 5, (old.returncode, out, err)
    said = json.loads(out)
    assert said["taken_over"] is True
    assert said["status"] == "finished", said  # the ledger's, not this process's "failed"
    assert "taken over by a newer owner" in err
    assert "owner " in said["error"]
    # The new owner's end stands: the old harness wrote nothing over it.
    again = store.get_run(run.id)
    assert again.status is RunStatus.FINISHED
    assert again.extra["answer"] == "answer to A"
    assert again.epoch == ended.epoch
