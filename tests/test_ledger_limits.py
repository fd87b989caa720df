"""An actor's limits in the ledger, on every backend: ``enqueue_run(limits=…)`` counts the actor's
queued and live runs and its requests of the last minute in the same transaction as the insert
(under a per-actor lock on PostgreSQL, the write lock on SQLite), so that two processes racing
admit no more than the limit; a refusal writes nothing. ``claim_next(live_limit=…)`` starts no
more of an actor's runs than its bound."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import pytest

from tether.ledger import Ledger, RunStatus, open_ledger
from tether.ledger.limits import LimitExceeded, LimitName, RunLimits

NONE = RunLimits(queued=None, live=None, per_minute=None)


def test_the_queued_limit_refuses_and_writes_nothing(ledger: Ledger) -> None:
    limits = RunLimits(queued=2, live=None, per_minute=None)
    for i in range(2):
        _, created = ledger.enqueue_run(f"s{i}", "rev", actor="user:ana", text="x", limits=limits)
        assert created
    with pytest.raises(LimitExceeded) as info:
        ledger.enqueue_run("s9", "rev", actor="user:ana", text="x", limits=limits)
    assert info.value.limit is LimitName.QUEUED
    assert (info.value.allowed, info.value.current) == (2, 2)
    assert info.value.retry_after_s >= 1
    assert ledger.session("s9") is None, "a refused request created its session"
    # another actor counts its own runs
    ledger.enqueue_run("s9", "rev", actor="user:bob", text="x", limits=limits)
    load = ledger.actor_load("user:ana")
    assert (load.queued, load.live, load.last_minute) == (2, 0, 2)


def test_a_repeated_request_id_is_answered_at_the_limit(ledger: Ledger) -> None:
    limits = RunLimits(queued=1, live=None, per_minute=None)
    run, _ = ledger.enqueue_run(
        "s1", "rev", actor="user:ana", text="x", request_id="k", limits=limits
    )
    again, created = ledger.enqueue_run(
        "s1", "rev", actor="user:ana", text="x", request_id="k", limits=limits
    )
    assert (again.id, created) == (run.id, False)


def test_live_runs_and_requests_a_minute(ledger: Ledger) -> None:
    a, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="x", limits=NONE)
    assert ledger.claim_next(owner="w", lease_s=30, session="s1") is not None
    live = RunLimits(queued=None, live=1, per_minute=None)
    with pytest.raises(LimitExceeded) as info:
        ledger.enqueue_run("s2", "rev", actor="user:ana", text="x", limits=live)
    assert info.value.limit is LimitName.LIVE
    per_minute = RunLimits(queued=None, live=None, per_minute=2)
    ledger.enqueue_run("s2", "rev", actor="user:ana", text="x", limits=per_minute)
    with pytest.raises(LimitExceeded) as info:
        ledger.enqueue_run("s3", "rev", actor="user:ana", text="x", limits=per_minute)
    assert info.value.limit is LimitName.PER_MINUTE
    assert 1 <= info.value.retry_after_s <= 60
    assert ledger.actor_load("user:ana").live == 1
    # A run that ended still counts in its minute; the queued count does not hold it.
    assert ledger.end_queued_run(
        ledger.queued_runs("s2")[0].id, RunStatus.INTERRUPTED, extra={"withdrawn_by": "user:ana"}
    )
    assert ledger.actor_load("user:ana").last_minute == 2
    assert a.status is RunStatus.QUEUED


def test_a_worker_starts_no_more_of_an_actors_runs_than_its_bound(ledger: Ledger) -> None:
    for i in range(3):
        ledger.enqueue_run(f"a{i}", "rev", actor="user:ana", text="x")
    ledger.enqueue_run("b0", "rev", actor="user:bob", text="x")

    def bound(actor: str) -> int:
        return 2 if actor == "user:ana" else 4

    claimed = []
    while (fence := ledger.claim_next(owner="w", lease_s=30, live_limit=bound)) is not None:
        claimed.append(fence.session)
    assert sorted(claimed) == ["a0", "a1", "b0"]  # a2 waits for one of ana's two to end
    assert [r.id for r in ledger.queued_runs("a2")]
    # Without a bound (tether run's own claim), it would be taken.
    assert ledger.claim_next(owner="w", lease_s=30) is not None


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_two_handles_racing_admit_no_more_than_the_limit(engine: str, tmp_path: Path) -> None:
    from conftest import BACKENDS

    url = BACKENDS[engine](tmp_path)
    limits = RunLimits(queued=20, live=None, per_minute=None)
    handles = [open_ledger(url), open_ledger(url)]
    start = threading.Barrier(16)

    def one(i: int) -> bool:
        if i < 16:
            start.wait()  # the first sixteen at once
        try:
            handles[i % 2].enqueue_run(
                f"race-{i}", "rev", actor="user:ana", text="x", limits=limits
            )
        except LimitExceeded:
            return False
        return True

    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            admitted = sum(pool.map(one, range(60)))
        assert admitted == 20
        assert handles[0].actor_load("user:ana").queued == 20
        assert len(handles[1].sessions()) == 20
    finally:
        for h in handles:
            h.close()
