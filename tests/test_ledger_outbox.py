"""The webhooks' outbox in the ledger, on every backend (``tether.ledger.outbox``): a run's end
writes its ``run.ended`` event in the same transaction, however it ends; the fan-out makes one
delivery per endpoint that takes it, once; deliveries are claimed under a lease (an attempt cut
short is due again when the lease ends), retried at a time or given up, and two processes on
PostgreSQL never claim the same delivery."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time

import pytest

from tether.errors import FencedOut
from tether.ledger import Fence, Ledger, RunStatus, open_ledger
from tether.ledger.outbox import Route

ALL = ("finished", "failed", "interrupted")
A = Route("http://a.test/hook", ("run.ended",), ALL)
B = Route("http://b.test/hook", ("run.ended",), ("failed",))


def _ended(ledger: Ledger, session: str, status: RunStatus = RunStatus.FINISHED) -> str:
    run, _ = ledger.enqueue_run(session, "rev", actor="user:ana", text="x")
    fence = ledger.claim_next(owner="w", lease_s=30, session=session)
    assert fence is not None
    assert fence.run == run.id
    ledger.end_run(fence, status, extra={"answer": "done"})
    return run.id


def test_every_end_is_an_event_fanned_out_once_per_endpoint_that_takes_it(ledger: Ledger) -> None:
    finished = _ended(ledger, "s1")
    failed = _ended(ledger, "s2", RunStatus.FAILED)
    queued, _ = ledger.enqueue_run("s3", "rev", actor="user:bob", text="y")
    assert ledger.end_queued_run(queued.id, RunStatus.FINISHED, extra={"delivered_into": "r"})
    assert ledger.deliveries() == []  # not fanned out yet
    assert ledger.fan_out([A, B]) == 3
    assert ledger.fan_out([A, B]) == 0, "an event was fanned out twice"
    got = [(d.run, d.endpoint, d.status, d.state, d.attempts) for d in ledger.deliveries()]
    assert got == [
        (finished, A.endpoint, "finished", "pending", 0),
        (failed, A.endpoint, "failed", "pending", 0),
        (failed, B.endpoint, "failed", "pending", 0),
        (queued.id, A.endpoint, "finished", "pending", 0),
    ]
    events = {d.run: d.event_id for d in ledger.deliveries()}
    assert len(set(events.values())) == 3
    assert all(e.startswith("evt_") for e in events.values())
    assert {d.session for d in ledger.deliveries(run=finished)} == {"s1"}
    # an endpoint added later gets the ends fanned out after it came
    late = Route("http://late.test/hook", ("run.ended",), ALL)
    after = _ended(ledger, "s4")
    assert ledger.fan_out([A, late]) == 1
    assert [d.run for d in ledger.deliveries(endpoint=late.endpoint)] == [after]


def test_fanning_out_with_no_endpoint_settles_the_events(ledger: Ledger) -> None:
    _ended(ledger, "s1")
    assert ledger.fan_out([]) == 1
    assert ledger.fan_out([A]) == 0
    assert ledger.deliveries() == []


def test_a_claim_counts_the_attempt_and_holds_it_until_its_lease_ends(ledger: Ledger) -> None:
    run = _ended(ledger, "s1")
    ledger.fan_out([A, B])
    now = time.time()
    first = ledger.claim_deliveries(A.endpoint, owner="p1", lease_s=20, now=now)
    assert [(d.run, d.attempts) for d in first] == [(run, 1)]
    assert ledger.claim_deliveries(A.endpoint, owner="p2", lease_s=20, now=now + 1) == []
    # p1 was killed mid-attempt: when its lease ends, the delivery is due again, anywhere
    again = ledger.claim_deliveries(A.endpoint, owner="p2", lease_s=20, now=now + 21)
    assert [(d.id, d.attempts) for d in again] == [(first[0].id, 2)]
    # p1's late report of failure is not p1's to make any more; p2's is
    assert not ledger.delivery_failed(first[0].id, owner="p1", error="x", retry_at=now)
    assert ledger.delivery_failed(
        first[0].id, owner="p2", error="503 from the endpoint", status=503, retry_at=now + 100
    )
    assert ledger.claim_deliveries(A.endpoint, owner="p2", lease_s=20, now=now + 99) == []
    retried = ledger.claim_deliveries(A.endpoint, owner="p3", lease_s=20, now=now + 100)
    assert [d.attempts for d in retried] == [3]
    assert ledger.delivery_sent(retried[0].id, status=204)
    assert not ledger.delivery_sent(retried[0].id, status=200), "delivered twice"
    (done,) = ledger.deliveries(endpoint=A.endpoint)
    assert (done.state, done.last_status, done.attempts) == ("delivered", 204, 3)
    assert done.done_at is not None


def test_endpoints_are_claimed_apart_and_a_delivery_is_given_up(ledger: Ledger) -> None:
    _ended(ledger, "s1", RunStatus.FAILED)
    ledger.fan_out([A, B])
    now = time.time()
    (b,) = ledger.claim_deliveries(B.endpoint, owner="p", lease_s=5, now=now)
    assert b.endpoint == B.endpoint
    (a,) = ledger.claim_deliveries(A.endpoint, owner="p", lease_s=5, now=now)
    assert ledger.delivery_failed(b.id, owner="p", error="refused", retry_at=None)
    assert ledger.delivery_dropped(a.id, reason="the run is gone")
    states = {d.endpoint: (d.state, d.last_error) for d in ledger.deliveries()}
    assert states == {A.endpoint: ("dropped", "the run is gone"), B.endpoint: ("failed", "refused")}
    assert ledger.claim_deliveries(B.endpoint, owner="p", lease_s=5, now=now + 1000) == []


def test_pruning_removes_what_is_settled_and_old(ledger: Ledger) -> None:
    _ended(ledger, "s1")
    pending = _ended(ledger, "s2")
    ledger.fan_out([A])
    (first, second) = ledger.claim_deliveries(A.endpoint, owner="p", lease_s=5)
    ledger.delivery_sent(first.id, status=200)
    assert ledger.prune_outbox(before="0000", endpoints=[A.endpoint]) == 0
    assert ledger.prune_outbox(before="9999", endpoints=[A.endpoint]) == 1
    assert [d.run for d in ledger.deliveries()] == [pending]
    # a pending delivery to an endpoint no longer configured goes too
    assert ledger.prune_outbox(before="9999", endpoints=[B.endpoint]) == 1
    assert ledger.deliveries() == []
    assert second.run == pending


def test_a_run_end_drops_its_request_images_data(ledger: Ledger) -> None:
    image = {"mimeType": "image/png", "bytes": 8, "sha256": "ab", "data": "iVBORw0K"}
    run, _ = ledger.enqueue_run(
        "s1", "rev", actor="user:ana", text="look", extra={"images": [image]}
    )
    assert ledger.get_run(run.id).extra["images"] == [image]
    fence = ledger.claim_next(owner="w", lease_s=30, session="s1")
    assert fence is not None
    ended = ledger.end_run(fence, RunStatus.FINISHED)
    assert ended.extra["images"] == [{"mimeType": "image/png", "bytes": 8, "sha256": "ab"}]


def test_a_fenced_out_end_writes_no_event(ledger: Ledger) -> None:
    run, _ = ledger.enqueue_run("s1", "rev", actor="user:ana", text="x")
    fence = ledger.claim_next(owner="w", lease_s=30, session="s1")
    assert fence is not None
    stale = Fence(run=run.id, session="s1", epoch=fence.epoch - 1)
    with pytest.raises(FencedOut):
        ledger.end_run(stale, RunStatus.FINISHED)
    assert ledger.fan_out([A]) == 0
    ledger.end_run(fence, RunStatus.FINISHED)
    assert ledger.fan_out([A]) == 1


def test_two_processes_never_claim_the_same_delivery(ledger: Ledger, ledger_url: str) -> None:
    for i in range(30):
        _ended(ledger, f"s{i}")
    ledger.fan_out([A])
    barrier = threading.Barrier(2)

    def claimer(name: str) -> list[int]:
        # a ledger of its own, as another process has (``memory:`` is one process's alone)
        got: list[int] = []
        with contextlib.ExitStack() as stack:
            mine = (
                ledger if ledger_url == "memory:" else stack.enter_context(open_ledger(ledger_url))
            )
            barrier.wait()
            while batch := mine.claim_deliveries(A.endpoint, owner=name, lease_s=60, limit=3):
                got += [d.id for d in batch]
        return got

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        one, two = pool.map(claimer, ["p1", "p2"])
    assert not set(one) & set(two), "a delivery was claimed twice"
    assert len(one) + len(two) == 30
