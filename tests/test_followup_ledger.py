"""The ledger reads and writes the follow-up view relies on, on every backend."""

from __future__ import annotations

from typing import Any

from tether.ledger import Ledger, NewRow, RowKind, RunStatus


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}


def test_a_compaction_carries_the_sources_of_the_rows_it_covers(ledger: Ledger) -> None:
    ledger.ensure_session("s1")
    fence = ledger.claim_run(ledger.create_run("s1", "rev").id)
    ledger.append(fence, [NewRow.message("user:ana", user("go"))], request=True)
    ledger.append(
        fence,
        [
            NewRow.message("tool:read", user("a"), sources=("repo:a",)),
            NewRow.message("tool:read", user("b"), sources=("doc:hb", "repo:a")),
            NewRow.message("tool:read", user("c"), sources=("repo:late",)),
        ],
    )
    first = {"summary": "s", "covers_to": 3}
    [c1] = ledger.append(fence, [NewRow("agent:rev", RowKind.COMPACTION, first, ("own:x",))])
    assert c1.seq == 5
    assert c1.sources == ("own:x", "doc:hb", "repo:a")
    stored = ledger.row("s1", 5)
    assert stored is not None
    assert stored.sources == c1.sources

    # A later compaction covers the first one (and so everything below it) plus row 4; rows in
    # the same append that it covers count too, and a row it does not cover does not.
    later = [
        NewRow.message("tool:read", user("d"), sources=("repo:same-batch",)),
        NewRow("agent:rev", RowKind.COMPACTION, {"summary": "t", "covers_to": 6}),
        NewRow.message("tool:read", user("e"), sources=("repo:after",)),
    ]
    _, c2, _ = ledger.append(fence, later)
    assert c2.seq == 7
    assert set(c2.sources) == {"own:x", "doc:hb", "repo:a", "repo:late", "repo:same-batch"}
    latest = ledger.latest_compaction("s1")
    assert latest is not None
    assert latest.sources == c2.sources


def test_ended_runs_and_first_row_of_a_run(ledger: Ledger) -> None:
    ledger.ensure_session("s1")
    ids = []
    for i in range(3):
        fence = ledger.claim_run(ledger.create_run("s1", "rev", run_id=f"r{i}").id)
        if i != 1:
            ledger.append(fence, [NewRow.message("user:ana", user(f"q{i}"))], request=True)
        ledger.end_run(fence, RunStatus.FAILED if i == 1 else RunStatus.FINISHED)
        ids.append(fence.run)
    ledger.claim_run(ledger.create_run("s1", "rev", run_id="live").id)
    ledger.create_run("s1", "other", run_id="x")
    assert [r.id for r in ledger.ended_runs("s1", "rev", limit=10)] == ["r2", "r1", "r0"]
    assert [r.id for r in ledger.ended_runs("s1", "rev", limit=2)] == ["r2", "r1"]
    assert ledger.ended_runs("s1", "other") == []
    assert ledger.run_first_seq("r0") == 1
    assert ledger.run_first_seq("r1") is None
    assert ledger.run_first_seq("r2") == 2
    assert ledger.run_first_seq("live") is None
