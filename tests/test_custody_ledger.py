"""Session custody in the ledger (docs/architecture.md#custody), one conformance suite for every
backend: the
queue is a FIFO, a session has at most one live run, leases expire and are taken over once.
The race of many processes on PostgreSQL is in tests/test_custody_race.py."""

from __future__ import annotations

import time

import pytest

from tether.errors import FencedOut, InvalidId, RunNotActive, SessionRefusing
from tether.ledger import Ledger, RunStatus


def test_enqueue_creates_the_session_and_a_queued_run_carrying_its_request(ledger: Ledger) -> None:
    run, created = ledger.enqueue_run("s1", "rev", actor="user:ana", text="hi", request_id="k1")
    assert created
    assert ledger.session("s1") is not None
    stored = ledger.get_run(run.id)
    assert stored.status is RunStatus.QUEUED
    assert stored.extra["request"] == {"text": "hi", "actor": "user:ana", "request_id": "k1"}
    assert stored.request_seq is None
    assert ledger.last_seq("s1") == 0  # no row until the run starts


def test_the_same_request_id_returns_the_same_run_and_writes_nothing(ledger: Ledger) -> None:
    first, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="hi", request_id="k1")
    again, created = ledger.enqueue_run("s1", "rev", actor="user:bo", text="other", request_id="k1")
    assert not created
    assert again.id == first.id
    assert again.extra["request"]["text"] == "hi"
    assert len(ledger.runs("s1")) == 1
    # The key is per session.
    _, created = ledger.enqueue_run("s2", "rev", actor="user:ana", text="hi", request_id="k1")
    assert created


def test_enqueue_is_refused_while_the_session_refuses(ledger: Ledger) -> None:
    ledger.ensure_session("s1")
    ledger.set_refusing("s1", "checked later")
    with pytest.raises(SessionRefusing):
        ledger.enqueue_run("s1", "rev", actor="user:ana", text="hi")
    assert ledger.runs("s1") == []


def test_claims_follow_the_queue_one_live_run_per_session(ledger: Ledger) -> None:
    a, _ = ledger.enqueue_run("s1", "rev", actor="u:a", text="1")
    b, _ = ledger.enqueue_run("s1", "rev", actor="u:a", text="2")
    c, _ = ledger.enqueue_run("s2", "rev", actor="u:a", text="3")
    # b is not first in its queue.
    assert ledger.claim_next(owner="w1", lease_s=30, run_id=b.id) is None
    f1 = ledger.claim_next(owner="w1", lease_s=30)
    assert f1 is not None
    assert f1.run == a.id
    assert f1.epoch == 1
    # s1 is busy now: the next claim takes s2's run, then nothing.
    f2 = ledger.claim_next(owner="w2", lease_s=30)
    assert f2 is not None
    assert f2.run == c.id
    assert ledger.claim_next(owner="w3", lease_s=30) is None
    assert ledger.claim_next(owner="w3", lease_s=30, run_id=b.id) is None
    assert [r.id for r in ledger.live_runs(session="s1")] == [a.id]
    assert [r.id for r in ledger.queued_runs("s1")] == [b.id]
    ledger.end_run(f1, RunStatus.FINISHED)
    f3 = ledger.claim_next(owner="w3", lease_s=30, run_id=b.id)
    assert f3 is not None
    assert f3.run == b.id
    with pytest.raises(RunNotActive):
        ledger.claim_next(owner="w3", lease_s=30, run_id=b.id)


def test_heartbeat_extends_the_lease_and_records_the_placement(ledger: Ledger) -> None:
    ledger.enqueue_run("s1", "rev", actor="u:a", text="1")
    fence = ledger.claim_next(owner="w1", lease_s=0.2)
    assert fence is not None
    lease = ledger.lease(fence.run)
    assert lease is not None
    assert lease.owner == "w1"
    assert lease.placement is None
    placement = {"host": "h1", "pi_pid": 42, "pi_start": 1.5, "run_dir": "/x"}
    ledger.heartbeat(fence, lease_s=60, placement=placement)
    lease = ledger.lease(fence.run)
    assert lease is not None
    assert lease.placement == placement
    assert lease.expires is not None
    assert lease.expires > time.time() + 50
    assert ledger.expired_leases() == []
    assert [r.id for r in ledger.expired_leases(now=time.time() + 61)] == [fence.run]


def test_an_expired_lease_is_taken_over_once_and_fences_out_the_old_owner(ledger: Ledger) -> None:
    ledger.enqueue_run("s1", "rev", actor="u:a", text="1")
    old = ledger.claim_next(owner="w1", lease_s=0.05)
    assert old is not None
    time.sleep(0.1)
    assert [r.id for r in ledger.expired_leases()] == [old.run]
    new = ledger.take_over(old.run, epoch=old.epoch, owner="w2", lease_s=30)
    assert new is not None
    assert new.epoch == old.epoch + 1
    # A second reconciler that saw the same epoch loses.
    assert ledger.take_over(old.run, epoch=old.epoch, owner="w3", lease_s=30) is None
    with pytest.raises(FencedOut):
        ledger.heartbeat(old, lease_s=30)
    ledger.heartbeat(new, lease_s=30)
    assert ledger.expired_leases() == []


def test_a_queued_run_can_be_withdrawn_a_started_one_cannot(ledger: Ledger) -> None:
    a, _ = ledger.enqueue_run("s1", "rev", actor="u:a", text="1")
    b, _ = ledger.enqueue_run("s1", "rev", actor="u:a", text="2")
    fence = ledger.claim_next(owner="w", lease_s=30)
    assert fence is not None
    assert fence.run == a.id
    assert not ledger.cancel_queued(a.id)
    assert ledger.cancel_queued(b.id)
    assert ledger.run(b.id) is None


def test_a_take_over_records_the_new_holder_and_keeps_the_old_placement_otherwise(
    ledger: Ledger,
) -> None:
    ledger.enqueue_run("s1", "rev", actor="u:a", text="1")
    old = ledger.claim_next(owner="w1", lease_s=30)
    assert old is not None
    ledger.heartbeat(old, lease_s=30, placement={"host": "h", "pi_pid": 7})
    kept = ledger.take_over(old.run, epoch=old.epoch, owner="w2", lease_s=30)
    assert kept is not None
    lease = ledger.lease(old.run)
    assert lease is not None
    assert (lease.owner, lease.placement) == ("w2", {"host": "h", "pi_pid": 7})
    new = ledger.take_over(
        old.run, epoch=kept.epoch, owner="w3", lease_s=30, placement={"host": "h", "pi_pid": 8}
    )
    assert new is not None
    lease = ledger.lease(old.run)
    assert lease is not None
    assert (lease.owner, lease.epoch, lease.placement) == (
        "w3",
        new.epoch,
        {"host": "h", "pi_pid": 8},
    )


def test_enqueue_checks_its_ids_before_writing(ledger: Ledger) -> None:
    for bad in ({"run_id": "r-\nx"}, {"actor": ""}):
        args = {"actor": "user:ana", "text": "hi", **bad}
        with pytest.raises(InvalidId):
            ledger.enqueue_run("s1", "rev", **args)
    with pytest.raises(InvalidId):
        ledger.enqueue_run("s1", "", actor="user:ana", text="hi")
    assert ledger.session("s1") is None


def test_workers_pass_by_a_run_a_tether_run_waits_for(ledger: Ledger) -> None:
    waiter = {"host": "h1", "harness_pid": 1, "harness_start": 0.0}
    mine, _ = ledger.enqueue_run("s1", "rev", actor="u:a", text="1", waiter=waiter)
    later, _ = ledger.enqueue_run("s1", "rev", actor="u:a", text="2")
    other, _ = ledger.enqueue_run("s2", "rev", actor="u:a", text="3")
    assert [(r.id, w) for r, w in ledger.waited_heads()] == [(mine.id, waiter)]
    assert [r.id for r, _ in ledger.waited_heads(session="s1")] == [mine.id]
    assert ledger.waited_heads(session="s2") == []
    # A worker takes s2's run, never the run its waiter will claim, nor the one queued behind it.
    taken = ledger.claim_next(owner="w1", lease_s=30)
    assert taken is not None
    assert taken.run == other.id
    assert ledger.claim_next(owner="w1", lease_s=30) is None
    # The waiter claims its own run by id; then the session's next run is any worker's.
    own = ledger.claim_next(owner="cli", lease_s=30, run_id=mine.id)
    assert own is not None
    assert ledger.waited_heads() == []
    ledger.end_run(own, RunStatus.FINISHED)
    next_one = ledger.claim_next(owner="w2", lease_s=30)
    assert next_one is not None
    assert next_one.run == later.id
