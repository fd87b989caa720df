"""The chat bridges' part of the ledger (tether.ledger.bridges), on every backend: a thread's
session decided once, an event recorded once, answers queued once per run, and outbox messages
claimed by one owner at a time under a lease."""

from __future__ import annotations

import time

from tether.ledger import Ledger, RunStatus
from tether.ledger.bridges import MessageKind, MessageState

B = "matrix:@bot:hs"


def test_a_threads_session_is_decided_once(ledger: Ledger) -> None:
    assert ledger.thread_of(B, "!r:hs", "$root") is None
    first = ledger.thread_session(B, "!r:hs", "$root", session="s-1", agent="rev")
    second = ledger.thread_session(B, "!r:hs", "$root", session="s-2", agent="other")
    assert first == second == ("s-1", "rev")
    assert ledger.thread_of(B, "!r:hs", "$root") == ("s-1", "rev")
    assert ledger.thread_of("matrix:@other:hs", "!r:hs", "$root") is None


def test_the_sync_cursor_is_kept_per_bridge(ledger: Ledger) -> None:
    assert ledger.bridge_cursor(B) is None
    ledger.set_bridge_cursor(B, "s1_2")
    ledger.set_bridge_cursor(B, "s1_3")
    ledger.set_bridge_cursor("matrix:@x:hs", "other")
    assert ledger.bridge_cursor(B) == "s1_3"


def test_an_ended_runs_answer_is_queued_once(ledger: Ledger) -> None:
    run, _ = ledger.enqueue_run("s-1", "rev", actor="user:ana", text="hi", request_id="$e1")
    assert ledger.record_event(B, "$e1", room="!r:hs", root="$e1", run=run.id)
    assert not ledger.record_event(B, "$e1", room="!r:hs", root="$e1", run=run.id)
    assert ledger.event_run(B, "$e1") == run.id
    assert ledger.pending_answers(B) == []  # still queued
    ledger.end_queued_run(run.id, RunStatus.FINISHED, extra={"answer": "hello"})
    [pending] = ledger.pending_answers(B)
    assert (pending.event, pending.room, pending.root, pending.run) == (
        "$e1",
        "!r:hs",
        "$e1",
        run.id,
    )
    key = f"answer:{run.id}"
    kw = {"room": "!r:hs", "root": "$e1", "kind": MessageKind.ANSWER, "body": "hello"}
    assert ledger.queue_message(B, key, answered=run.id, **kw)  # type: ignore[arg-type]
    assert ledger.pending_answers(B) == []
    assert not ledger.queue_message(B, key, answered=run.id, **kw)  # type: ignore[arg-type]
    assert [m.key for m in ledger.bridge_messages(B)] == [key]


def test_a_message_is_claimed_by_one_owner_and_retried_after_its_lease(ledger: Ledger) -> None:
    ledger.queue_message(B, "k", room="!r:hs", root="$e", kind=MessageKind.NOTICE, body="no")
    now = time.time()
    [m] = ledger.claim_messages(B, owner="a", lease_s=30, now=now)
    assert (m.attempts, m.parts_sent, m.kind, m.body) == (1, 0, MessageKind.NOTICE, "no")
    assert ledger.claim_messages(B, owner="b", lease_s=30, now=now) == []
    assert ledger.message_part_sent(m.id, owner="a", parts_sent=1)
    # the lease lapsed (the owner died): another owner takes it, with the same txn and progress
    [again] = ledger.claim_messages(B, owner="b", lease_s=30, now=now + 31)
    assert (again.txn, again.parts_sent, again.attempts) == (m.txn, 1, 2)
    # the first owner's late report changes nothing now
    assert not ledger.message_failed(m.id, owner="a", error="late", retry_at=now)
    assert ledger.message_failed(again.id, owner="b", error="M_LIMIT_EXCEEDED", retry_at=now + 40)
    assert ledger.claim_messages(B, owner="c", lease_s=30, now=now + 35) == []
    [third] = ledger.claim_messages(B, owner="c", lease_s=30, now=now + 41)
    assert third.last_error == "M_LIMIT_EXCEEDED"
    assert ledger.message_sent(third.id)
    assert not ledger.message_sent(third.id)
    assert ledger.bridge_messages(B)[0].state is MessageState.SENT
    assert ledger.claim_messages(B, owner="c", lease_s=30, now=now + 100) == []
