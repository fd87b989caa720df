"""``tether ledger copy``: SQLite → PostgreSQL → SQLite, exactly (dumps byte-identical), and a
non-empty destination session is refused with nothing written."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pg import fresh_schema_url
from tether.cli.app import app
from tether.errors import AlreadyExists, FencedOut, LedgerError, NotFound
from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger
from tether.ledger.copy import copy_sessions
from tether.ledger.jsonl import dump_session, load_file

EXAMPLE = Path(__file__).parent.parent / "src" / "tether" / "examples" / "review.jsonl"


def dump(ledger: Ledger, session: str) -> str:
    out = io.StringIO()
    dump_session(ledger, session, out)
    return out.getvalue()


def dumps(ledger: Ledger) -> dict[str, str]:
    return {s.id: dump(ledger, s.id) for s in ledger.sessions()}


def msg(role: str, text: str, **kw: Any) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}], **kw}


def build(ledger: Ledger, sid: str = "s1", rows: int = 3) -> None:
    """A session with every kind of record and state a copy must carry."""
    ledger.create_session(sid, extra={"channel": "#ops", "nested": {"b": 1, "a": [1, 2]}})
    done = ledger.create_run(sid, "reviewer", run_id=f"{sid}-r1", extra={"model": "smollm2"})
    f = ledger.claim_run(done.id)
    ledger.append(
        f, [NewRow.message("user:ana", msg("user", "review PR 7\u2028please"))], request=True
    )
    ledger.append(
        f,
        [
            NewRow(
                actor="agent:reviewer",
                kind=RowKind.MESSAGE,
                body={
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm \x00 nul"},
                        {
                            "type": "toolCall",
                            "id": "c1",
                            "name": "bash",
                            "arguments": {"cmd": "ls"},
                        },
                    ],
                },
                sources=("repo:acme/api",),
                entry_id="e-1",
                extra={"pi_parent": "e-0"},
            ),
            NewRow.message(
                "tool:bash",
                {
                    "role": "toolResult",
                    "toolCallId": "c1",
                    "content": [{"type": "image", "data": "QUJD" * 50, "mimeType": "image/png"}],
                },
                entry_id="e-2",
            ),
        ],
    )
    for i in range(rows):
        ledger.append(f, [NewRow.message("agent:reviewer", msg("assistant", f"step {i} ✓"))])
    ledger.append(
        f,
        [
            NewRow(
                actor="agent:reviewer",
                kind=RowKind.COMPACTION,
                body={
                    "summary": "so far",
                    "continuation": {"version": 1, "run": done.id},
                    "covers_to": ledger.last_seq(sid),
                    "tokens_before": 71234,
                },
                sources=("repo:acme/api", "doc:handbook"),
            )
        ],
    )
    ledger.end_run(f, RunStatus.FINISHED, extra={"checkpoint": "written"})

    failed = ledger.create_run(sid, "reviewer", run_id=f"{sid}-r2")
    f2 = ledger.claim_run(failed.id)
    ledger.append(f2, [NewRow.message("user:bob", msg("user", "again"))], request=True)
    ledger.append(
        f2,
        [
            NewRow(
                actor="agent:reviewer",
                kind=RowKind.RECEIPT,
                body={
                    "kind": "continuation_checkpoint_refused",
                    "run": failed.id,
                    "reason": "empty",
                },
            )
        ],
    )
    ledger.end_run(f2, RunStatus.FAILED)

    # A running run taken over twice (epoch 3) and a queued one.
    live = ledger.create_run(sid, "helper", run_id=f"{sid}-r3")
    old = ledger.claim_run(live.id)
    ledger.claim_run(live.id)
    new = ledger.claim_run(live.id)
    with pytest.raises(FencedOut):
        ledger.append(old, [NewRow.message("agent:helper", msg("assistant", "stale"))])
    ledger.append(new, [NewRow.message("agent:helper", msg("assistant", "live"))])
    ledger.update_run_extra(new, {"progress": 0.5})
    ledger.create_run(sid, "reviewer", run_id=f"{sid}-r4")
    ledger.add_note(sid, "reviewer", "prefers small PRs")
    ledger.add_note(sid, "helper", "ünïcode note", at="2026-11-29T10:00:00Z")
    ledger.set_refusing(sid, "idle not confirmed")


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema_url() as url:
        yield url


def test_sqlite_to_postgres_to_sqlite_is_exact(tmp_path: Path, pg_url: str) -> None:
    a_url, c_url = f"sqlite://{tmp_path}/a.db", f"sqlite://{tmp_path}/c.db"
    with open_ledger(a_url) as a:
        build(a, "s1")
        build(a, "s2", rows=2600)  # more than a page and an import chunk
        load_file(a, EXAMPLE)
        original = dumps(a)
        with open_ledger(pg_url) as b:
            report = copy_sessions(a, b)
            assert (report.sessions, report.runs, report.notes) == (3, 10, 5)
            assert report.rows == sum(a.last_seq(s) for s in original)
            assert dumps(b) == original
            with open_ledger(c_url) as c:
                copy_sessions(b, c, ["s2", "review-42"])
                copy_sessions(b, c, ["s1"])
                assert dumps(c) == original
                for store in (b, c):
                    # The copy is a working ledger: seqs continue, reads find the same rows.
                    assert store.latest_compaction("s2") == a.latest_compaction("s2")
                    assert store.last_ended_run("s1", "reviewer") == a.last_ended_run(
                        "s1", "reviewer"
                    )
                    assert store.tail("s2", 5000) == a.tail("s2", 5000)
                    assert store.row("s1", 2) == a.row("s1", 2)
                    assert store.notes("s1", "helper") == a.notes("s1", "helper")
                    assert store.get_session("s1").refusing == "idle not confirmed"
                    assert store.get_run("s1-r3").epoch == 3
                    fence = store.claim_run("s1-r3")
                    assert fence.epoch == 4
                    [row] = store.append(
                        fence, [NewRow.message("agent:helper", msg("assistant", "after"))]
                    )
                    assert row.seq == a.last_seq("s1") + 1


def test_a_non_empty_destination_session_is_refused_and_nothing_is_written(
    tmp_path: Path, pg_url: str
) -> None:
    with open_ledger(f"sqlite://{tmp_path}/a.db") as a, open_ledger(pg_url) as b:
        build(a, "s1")
        build(a, "s2")
        b.create_session("s2")
        run = b.create_run("s2", "other")
        before = dumps(b)
        with pytest.raises(AlreadyExists, match="'s2' already exists in the destination"):
            copy_sessions(a, b)
        with pytest.raises(AlreadyExists, match="not empty"):
            copy_sessions(a, b, ["s1", "s2"])
        assert dumps(b) == before
        assert b.session("s1") is None

        # A run id taken in another session of the destination: refused too, nothing written.
        b.create_session("x")
        b.create_run("x", "other", run_id="s1-r2")
        before = dumps(b)
        with pytest.raises(AlreadyExists, match="run 's1-r2'"):
            copy_sessions(a, b, ["s1"])
        assert dumps(b) == before
        assert b.run(run.id) is not None

        with pytest.raises(NotFound):
            copy_sessions(a, b, ["nope"])


def test_an_empty_destination_session_is_taken_over(tmp_path: Path, pg_url: str) -> None:
    with open_ledger(f"sqlite://{tmp_path}/a.db") as a, open_ledger(pg_url) as b:
        build(a, "s1")
        b.ensure_session("s1")
        copy_sessions(a, b, ["s1"])
        assert dumps(b) == dumps(a)


def test_a_failure_mid_copy_writes_nothing(tmp_path: Path, pg_url: str) -> None:
    with open_ledger(f"sqlite://{tmp_path}/a.db") as a, open_ledger(pg_url) as b:
        build(a, "s1")
        build(a, "s2", rows=1500)
        # A row of s2 vanishes from the source behind the ledger's back: the copy, already
        # writing s1 and s2 in its transaction, must stop and leave the destination as it was.
        with a._tx() as c:
            c.execute("DELETE FROM rows WHERE session = ? AND seq = ?", ("s2", 1200))
        with pytest.raises(LedgerError, match="no dense rows after seq 1000"):
            copy_sessions(a, b)
        assert b.sessions() == []


def test_cli_copy_and_dump(tmp_path: Path, pg_url: str) -> None:
    src = f"sqlite://{tmp_path}/a.db"
    with open_ledger(src) as a:
        build(a, "s1")
    runner = CliRunner()
    done = runner.invoke(app, ["ledger", "copy", src, pg_url, "--session", "s1"])
    assert done.exit_code == 0, done.output
    assert "copied 1 sessions, 4 runs" in done.output
    dumped = [
        runner.invoke(app, ["ledger", "dump", "--session", "s1", "--ledger", url])
        for url in (src, pg_url)
    ]
    assert all(d.exit_code == 0 for d in dumped), [d.output for d in dumped]
    assert dumped[0].stdout == dumped[1].stdout
    assert dumped[0].stdout.count("\n") > 10

    again = runner.invoke(app, ["ledger", "copy", src, pg_url])
    assert again.exit_code == 1
    assert "not empty" in again.output
