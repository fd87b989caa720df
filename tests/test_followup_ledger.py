"""The ledger reads and writes the follow-up view relies on, on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pg import fresh_schema_url
from tether.ledger import Ledger, NewRow, Row, RowKind, Run, RunStatus, Session, open_ledger


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


@pytest.mark.postgres
def test_the_new_reads_are_index_scans_on_postgresql() -> None:
    """ended_runs and run_first_seq stay bounded on a long session: index scans, no sort, no
    rows read and thrown away (EXPLAIN ANALYZE)."""
    runs = [
        Run(f"r{i}", "s", "rev", RunStatus.FINISHED, request_seq=i * 10 + 1) for i in range(2000)
    ]
    rows = [
        Row("s", i * 10 + k + 1, f"r{i}", "user:ana", RowKind.MESSAGE, user(f"{i}.{k}"), (), 0)
        for i in range(2000)
        for k in range(10)
    ]
    with fresh_schema_url() as url, open_ledger(url) as ledger:
        ledger.import_records([Session("s", "t")], runs, rows, [])
        with psycopg.connect(url, autocommit=True) as conn:
            # This schema's tables only: a bare ANALYZE takes every schema in the database,
            # another test's half-loaded "fresh" one too, and its plans with them.
            conn.execute("ANALYZE sessions, runs, rows, notes")
        assert [r.id for r in ledger.ended_runs("s", "rev", limit=3)] == [
            "r1999",
            "r1998",
            "r1997",
        ]
        assert ledger.run_first_seq("r1000") == 10_001
        statements = [
            (
                "SELECT id FROM runs WHERE session = %s AND agent = %s AND status IN "
                "('finished', 'failed', 'interrupted') ORDER BY ord DESC LIMIT %s",
                ("s", "rev", 3),
            ),
            ("SELECT seq FROM rows WHERE run = %s ORDER BY seq LIMIT 1", ("r1000",)),
        ]
        with psycopg.connect(url, autocommit=True) as conn:
            for sql, params in statements:
                cur = psycopg.ClientCursor(conn)
                [[doc]] = cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchall()
                nodes = list(_nodes(doc[0]["Plan"]))
                kinds = [(n["Node Type"], n.get("Index Name")) for n in nodes]
                scans = [n for n in nodes if "Scan" in n["Node Type"]]
                assert scans, kinds
                assert all("Index" in n["Node Type"] for n in scans), kinds
                assert "Sort" not in {k for k, _ in kinds}, kinds
                assert sum(n.get("Rows Removed by Filter", 0) for n in scans) == 0, kinds


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)
