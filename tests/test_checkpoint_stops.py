"""Stops, deadlines and a dying harness while the continuation summary runs (invariants 14–17),
with the real pi, the scripted provider, and ``tether run`` as a process where it matters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpoint_support import (
    AGENT,
    ANSWER,
    SUMMARY,
    config,
    long_task,
    pi_processes,
    rows_of,
    run_once,
    wait_for,
)
from provider import Reply, ScriptedProvider, Stall, route
from tether.clock import ManualClock
from tether.config import Config
from tether.errors import SessionRefusing
from tether.harness.run import RunOutcome
from tether.harness.stops import StopControl, StopReason
from tether.ledger import Ledger, RowKind, RunStatus, open_ledger

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

Stopped = tuple[ScriptedProvider, Config, RunOutcome]
"""The provider, the config and the outcome of a run stopped during its summary."""


@pytest.fixture
def store(tmp_path: Path) -> Any:
    ledger = open_ledger(f"sqlite://{tmp_path}/ledger.db")
    yield ledger
    ledger.close()


def stalled(scripted_provider: Any) -> ScriptedProvider:
    """The task turn runs; the summary request then hangs until the test ends."""
    provider: ScriptedProvider = scripted_provider(route(task=long_task(), summary=[Stall(None)]))
    return provider


async def with_summary_running(
    ledger: Ledger,
    provider: ScriptedProvider,
    tmp: Path,
    act: Any,
    **kw: Any,
) -> RunOutcome:
    """Start a run; once pi's summary request reaches the provider, call ``act()``."""
    outcome: list[RunOutcome] = []
    async with anyio.create_task_group() as tg:

        async def go() -> None:
            outcome.append(await run_once(ledger, kw.pop("cfg"), tmp, **kw))

        tg.start_soon(go)
        await wait_for(lambda: provider.summary_requests)
        act()
    return outcome[0]


def assert_refused_cleanly(ledger: Ledger, outcome: RunOutcome, provider: ScriptedProvider) -> None:
    """No checkpoint, one receipt, the answer kept, nothing asked of the provider again."""
    assert outcome.answer == ANSWER
    assert outcome.checkpoint.label == "refused:cancelled"
    assert rows_of(ledger, "s1", RowKind.COMPACTION) == []
    [receipt] = rows_of(ledger, "s1", RowKind.RECEIPT)
    assert receipt.body == {
        "kind": "continuation_checkpoint_refused",
        "run": outcome.run,
        "reason": "cancelled",
    }
    record = ledger.get_run(outcome.run)
    assert record.extra["answer"] == ANSWER
    assert record.extra["needs_recall"] is True
    assert len(provider.summary_requests) == 1
    assert len(provider.task_requests) == 2
    assert pi_processes(str(outcome.run_dir)) == []


def in_summary(
    scripted_provider: Any,
    store: Ledger,
    tmp_path: Path,
    act: Callable[[StopControl, ManualClock], object],
    *,
    clocked: bool = False,
    **config_kw: Any,
) -> Stopped:
    """A run whose summary stalls; once the summary request is in, ``act(stop, clock)`` with
    the run's stop control and, when ``clocked``, its clock (else the real clock runs it)."""
    provider = stalled(scripted_provider)
    cfg = config(tmp_path, provider, **config_kw)

    async def main() -> RunOutcome:
        # made in the event loop: both hold anyio events
        stop, clock = StopControl(), ManualClock()
        return await with_summary_running(
            store,
            provider,
            tmp_path,
            lambda: act(stop, clock),
            cfg=cfg,
            stop=stop,
            clock=clock if clocked else None,
        )

    return provider, cfg, anyio.run(main)


def past_the_deadline(
    scripted_provider: Any, store: Ledger, tmp_path: Path, advance: float
) -> Stopped:
    """:func:`in_summary` with a deadline of 100 s (grace 5 s), the clock moved ``advance`` s."""
    return in_summary(
        scripted_provider,
        store,
        tmp_path,
        lambda _, clock: clock.advance(advance),
        clocked=True,
        deadline_s=100,
        stop_grace_s=5,
    )


def _soft(scripted_provider: Any, store: Ledger, tmp_path: Path) -> Stopped:
    # The task turn had finished: the run did too; the stop only cut its checkpoint short.
    return in_summary(scripted_provider, store, tmp_path, lambda stop, _: stop.soft())


def _deadline(scripted_provider: Any, store: Ledger, tmp_path: Path) -> Stopped:
    return past_the_deadline(scripted_provider, store, tmp_path, 100.5)


def _hard(scripted_provider: Any, store: Ledger, tmp_path: Path) -> Stopped:
    # pi is dead and its session file was mirrored as it stands: nothing is left unknown.
    return in_summary(scripted_provider, store, tmp_path, lambda stop, _: stop.stop_hard())


@pytest.mark.parametrize(
    ("stopped", "status", "reason"),
    [
        (_soft, RunStatus.FINISHED, StopReason.SOFT_STOP),
        (_deadline, RunStatus.FINISHED, StopReason.DEADLINE),
        (_hard, RunStatus.INTERRUPTED, StopReason.HARD_STOP),
    ],
    ids=["soft_stop", "deadline", "hard_stop"],
)
def test_a_stop_aborts_the_summary(
    scripted_provider: Any,
    store: Ledger,
    tmp_path: Path,
    stopped: Callable[[Any, Ledger, Path], Stopped],
    status: RunStatus,
    reason: StopReason,
) -> None:
    provider, _, outcome = stopped(scripted_provider, store, tmp_path)
    assert (outcome.status, outcome.stop_reason) == (status, reason)
    assert_refused_cleanly(store, outcome, provider)
    assert store.get_session("s1").refusing is None


def test_idle_not_confirmed_by_the_deadline_keeps_the_answer_and_refuses_the_session(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    # Past the deadline and its grace at once: pi's idle cannot have been confirmed in time.
    provider, cfg, outcome = past_the_deadline(scripted_provider, store, tmp_path, 1000)
    assert outcome.answer == ANSWER
    assert outcome.checkpoint.label == "refused:cancelled"
    assert rows_of(store, "s1", RowKind.COMPACTION) == []
    assert len(provider.summary_requests) == 1
    refusing = store.get_session("s1").refusing
    assert refusing is not None
    assert "idle was not confirmed" in refusing

    # New runs on the session are refused (exit 3) until an operator clears it.
    with pytest.raises(SessionRefusing):
        anyio.run(lambda: run_once(store, cfg, tmp_path))
    toml = write_toml(tmp_path, provider, budget=200_000)
    refused = tether(
        "run", "--config", str(toml), "-s", "s1", "-a", AGENT, "--json", "hi", cwd=tmp_path
    )
    assert refused.returncode == 3, refused.stderr
    cleared = tether("session", "clear", "s1", "--config", str(toml), cwd=tmp_path)
    assert cleared.returncode == 0, cleared.stderr
    assert store.get_session("s1").refusing is None


# -- tether run as a process ----------------------------------------------------------------------


def write_toml(
    tmp: Path,
    provider: ScriptedProvider,
    *,
    budget: int,
    name: str = "t",
    deadline_s: float = 120,
) -> Path:
    (tmp / "work").mkdir(exist_ok=True)
    path = tmp / f"{name}-{budget}.toml"
    path.write_text(
        f"""
[ledger]
url = "sqlite://{tmp}/ledger.db"

[followup]
budget_bytes = {budget}

[providers.local]
base_url = "{provider.url}"
context_window = 64000
max_tokens = 2048

[agents.{AGENT}]
provider = "local"
model = "{provider.model}"
tools = ["bash"]
deadline_s = {deadline_s}
checkpoint_min_time_s = 0
workdir = "{tmp}/work"

[harness]
runs_dir = "{tmp}/runs"
pi_settings = {{ retry = {{ maxRetries = 2, baseDelayMs = 10 }} }}
""",
        encoding="utf-8",
    )
    return path


def tether_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tether", *args]


def tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tether_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_tether_run_json_reports_written_and_not_needed(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(
        route(task=[*long_task(), Reply("short answer")], summary=[Reply(SUMMARY)])
    )
    small = write_toml(tmp_path, provider, budget=4000)
    done = tether(
        "run", "--config", str(small), "-s", "s1", "-a", AGENT, "--json", "count", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["checkpoint"], out["answer"]) == ("finished", "written", ANSWER)
    [row] = rows_of(store, "s1", RowKind.COMPACTION)
    assert row.run == out["run"]

    large = write_toml(tmp_path, provider, budget=200_000)
    again = tether(
        "run", "--config", str(large), "-s", "s1", "-a", AGENT, "--json", "and?", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert (out["checkpoint"], out["answer"]) == ("not_needed", "short answer")
    assert len(provider.summary_requests) == 1


def _kill_tether_during_the_summary(
    provider: ScriptedProvider, store: Ledger, tmp_path: Path, config_path: Path
) -> tuple[str, str]:
    proc = subprocess.Popen(
        tether_argv(
            "run", "--config", str(config_path), "-s", "s1", "-a", AGENT, "--json", "count"
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not provider.summary_requests:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no summary request arrived"
            time.sleep(0.02)
        [run] = store.runs("s1")
        run_dir = str(tmp_path / "runs" / run.id)
        assert pi_processes(run_dir), "pi should be running the summary"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    # pi outlives its harness (docs/architecture.md#custody): it goes on writing the summary.
    assert pi_processes(run_dir), "pi died with its harness"
    assert store.get_run(run.id).status is RunStatus.RUNNING  # its owner died mid-step
    return run.id, run_dir


def test_killing_tether_during_the_summary_resumes_on_the_same_pi_without_a_second_compact(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(
        route(
            task=[*long_task(), Reply("after the crash")],
            summary=[Reply(SUMMARY, delay_s=3)],
        )
    )
    small = write_toml(tmp_path, provider, budget=4000)
    run_id, run_dir = _kill_tether_during_the_summary(provider, store, tmp_path, small)
    pi_before = set(pi_processes(run_dir))

    done = tether("recover", "--config", str(small), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
    assert item["resolution"] == "resumed", item
    out = item["outcome"]
    # The checkpoint the original pi process wrote, acknowledged once, never asked for again.
    assert (out["status"], out["answer"], out["checkpoint"]) == ("finished", ANSWER, "written")
    # A second `compact` would have made pi summarise again (a second summary request) or
    # refuse (a receipt row); the run ended well, so its directory (pi's events) is gone.
    assert len(provider.summary_requests) == 1
    assert rows_of(store, "s1", RowKind.RECEIPT) == []
    assert not Path(run_dir).exists()
    [row] = rows_of(store, "s1", RowKind.COMPACTION)
    assert row.run == run_id
    assert store.get_run(run_id).extra.get("checkpoint_by") == "original"
    assert pi_before, "pi was running before the recovery"
    assert not pi_processes(run_dir), "pi was closed after the resumed run ended"
    # Every entry of the run mirrored exactly once.
    ids = [r.entry_id for r in store.iter_rows("s1") if r.entry_id]
    assert len(ids) == len(set(ids))

    # The next run starts from the checkpoint; nothing is replayed.
    large = write_toml(tmp_path, provider, budget=200_000)
    after = tether(
        "run", "--config", str(large), "-s", "s1", "-a", AGENT, "--json", "again", cwd=tmp_path
    )
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["answer"] == "after the crash"
    assert len(provider.summary_requests) == 1


@pytest.mark.slow
def test_killing_tether_during_a_stalled_summary_leaves_it_unacknowledged(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(
        route(task=[*long_task(), Reply("after the crash")], summary=[Stall(None)])
    )
    small = write_toml(tmp_path, provider, budget=4000, deadline_s=20)
    _run_id, run_dir = _kill_tether_during_the_summary(provider, store, tmp_path, small)

    done = tether("recover", "--config", str(small), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
    assert item["resolution"] == "resumed", item
    out = item["outcome"]
    # The summary never came by the run's deadline: no checkpoint, the answer kept, and no
    # second compact was sent (pi asked the provider for one summary only).
    assert out["answer"] == ANSWER
    assert out["checkpoint"].startswith("refused")
    assert rows_of(store, "s1", RowKind.COMPACTION) == []
    assert len(provider.summary_requests) == 1
    # At the deadline the resumed harness sent `abort` (never the summary again) and pi
    # answered it: pi's idle is confirmed, so the session does not refuse and the run's
    # directory is gone with its events. A second `compact` would have made pi summarise again
    # (a second summary request) or refuse it (a second receipt): one receipt, the abort's.
    [receipt] = rows_of(store, "s1", RowKind.RECEIPT)
    assert receipt.body["reason"] == "cancelled"
    assert store.get_session("s1").refusing is None
    assert not Path(run_dir).exists()
    assert not pi_processes(run_dir)
