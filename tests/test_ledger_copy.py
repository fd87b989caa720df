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
from tether.errors import AlreadyExists, FencedOut, NotFound, StorageError, UsageError
from tether.followup import build_view
from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger
from tether.ledger.copy import copy_sessions
from tether.ledger.jsonl import dump_session, load_file
from tether.ledger.lifecycle import Selector, SelectorKind

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


def test_a_failure_mid_copy_writes_nothing(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_ledger(f"sqlite://{tmp_path}/a.db") as a, open_ledger(pg_url) as b:
        build(a, "s1")
        build(a, "s2", rows=1500)
        # The source fails on the second page of s2's rows: the copy, already writing s1 and
        # s2 in its transaction, must stop and leave the destination as it was.
        reads = a.rows_range

        def failing(session: str, first: int, last: int, *, limit: int = 1000) -> Any:
            if session == "s2" and first > 1:
                raise StorageError("the source went away")
            return reads(session, first, last, limit=limit)

        monkeypatch.setattr(a, "rows_range", failing)
        with pytest.raises(StorageError, match="went away"):
            copy_sessions(a, b)
        assert b.sessions() == []


def test_cli_copy_and_dump(tmp_path: Path, pg_url: str) -> None:
    src = f"sqlite://{tmp_path}/a.db"
    with open_ledger(src) as a:
        build(a, "s1")
    runner = CliRunner()
    done = runner.invoke(app, ["ledger", "copy", src, pg_url, "--session", "s1"])
    assert done.exit_code == 0, done.output
    assert "copied 1 session, 4 runs" in done.output
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


# -- forks, erasure, queued runs -------------------------------------------------------------

GRANTS = {"user:ana": ["*"]}


def _turn(ledger: Ledger, sid: str, i: int, *, sources: tuple[str, ...] = ()) -> str:
    """Turn ``i`` of session ``sid``: a request, an answer (carrying ``sources``), now and then
    an image, a checkpoint over everything before it or a refused checkpoint's receipt, and a
    note."""
    fence = ledger.claim_run(ledger.create_run(sid, "rev", run_id=f"{sid}-t{i}").id)
    ledger.append(fence, [NewRow.message("user:ana", msg("user", f"request {i}"))], request=True)
    rows = [NewRow.message("agent:rev", msg("assistant", f"answer {i}"), sources=sources)]
    if i % 3 == 1:
        image = {"type": "image", "data": "QUJD" * (10 + i), "mimeType": "image/png"}
        rows.append(
            NewRow.message(
                "tool:read", {"role": "toolResult", "toolCallId": f"c{i}", "content": [image]}
            )
        )
    if i % 3 == 2:
        rows.append(
            NewRow(
                actor="agent:rev",
                kind=RowKind.COMPACTION,
                body={
                    "summary": f"so far {i}",
                    "continuation": {"version": 1, "run": fence.run},
                    "covers_to": ledger.last_seq(sid) + len(rows),
                    "tokens_before": 100 + i,
                },
            )
        )
    if i % 4 == 3:
        receipt = {"kind": "continuation_checkpoint_refused", "run": fence.run, "reason": "empty"}
        rows.append(NewRow(actor="agent:rev", kind=RowKind.RECEIPT, body=receipt))
    ledger.append(fence, rows)
    ledger.add_note(sid, "rev", f"note {i}", actor="user:ana", run=fence.run, sources=sources)
    ledger.end_run(fence, RunStatus.FINISHED)
    return fence.run


def _fork_cli(url: str, tmp: Path, session: str, at: str, new: str) -> None:
    cfg = tmp / "fork.toml"
    cfg.write_text(f'[harness]\nruns_dir = "{tmp}/runs"\nworkspaces_dir = "{tmp}/workspaces"\n')
    done = CliRunner().invoke(
        app, ["fork", "-s", session, "--at", at, "-n", new, "--config", str(cfg), "--ledger", url]
    )
    assert done.exit_code == 0, done.output


def grow(ledger: Ledger, tmp: Path) -> None:
    """A ledger with forks: ``main``; ``a-fork`` of it (with ``tether fork``), which goes on
    as ``main`` does; ``a-fork-of-fork`` of ``a-fork`` at a run of its own, with a queued run;
    ``b-deep`` of ``a-fork`` at a run it inherits; a source erased from all of them (a gap
    in each, and a receipt); notes everywhere."""
    ledger.create_session("main", extra={"channel": "#ops"})
    runs = [_turn(ledger, "main", i, sources=("repo:secret",) if i == 1 else ()) for i in range(4)]
    _fork_cli(ledger.url, tmp, "main", runs[2], "a-fork")
    for i in (4, 5):
        _turn(ledger, "main", i)
    own = [_turn(ledger, "a-fork", i) for i in (6, 7)]
    # listed first (by their creation), before the sessions they were forked from
    early = "2000-01-01T00:00:00Z"
    ledger.fork_session("a-fork", own[1], "a-fork-of-fork", created=early)
    ledger.fork_session("a-fork", runs[1], "b-deep", created=early)
    _turn(ledger, "a-fork-of-fork", 8)
    _turn(ledger, "b-deep", 9)
    ledger.enqueue_run("a-fork-of-fork", "rev", actor="user:bob", text="later", request_id="req-1")
    ledger.add_note("main", "ops", "a note after the forks", actor="user:ana")
    ledger.erase(Selector(SelectorKind.SOURCE, "repo:secret"), actor="admin:ana")


def seen(ledger: Ledger) -> dict[str, Any]:
    """What readers get of each session: its dump, the next view of each agent, its fork link;
    and the ledger's erasure receipts."""
    out: dict[str, Any] = {
        "erasures": [(e.at, e.actor, e.selector, e.counts) for e in ledger.erasures()]
    }
    for s in ledger.sessions():
        views = []
        for agent in ("rev", "ops"):
            view = build_view(
                ledger, session=s.id, agent=agent, actor="user:ana", request="next?", grants=GRANTS
            )
            views.append(view.to_json())
        out[s.id] = (dump(ledger, s.id), views, ledger.fork_of(s.id))
    return out


@pytest.mark.postgres  # both ways go through PostgreSQL (the id names only the source)
@pytest.mark.parametrize("source_engine", ["sqlite", "postgres"])
def test_a_ledger_with_forks_and_an_erasure_copies_whole(
    source_engine: str, tmp_path: Path, pg_url: str
) -> None:
    """SQLite → PostgreSQL and PostgreSQL → SQLite: every session of a ledger with forks (in
    any order), a fork of a fork, an erasure, notes, media, checkpoints and a queued run
    arrives as it was: the same dumps, views and fork links, and the receipt."""
    sqlite_url = f"sqlite://{tmp_path}/l.db"
    src_url, dst_url = (sqlite_url, pg_url) if source_engine == "sqlite" else (pg_url, sqlite_url)
    with open_ledger(src_url) as a, open_ledger(dst_url) as b:
        grow(a, tmp_path)
        assert [s.id for s in a.sessions()] == ["a-fork-of-fork", "b-deep", "main", "a-fork"]
        assert a.fork_of("a-fork") is not None
        assert a.fork_of("b-deep") is not None
        report = copy_sessions(a, b)
        assert (report.sessions, report.forks, report.erasures) == (4, 3, 1)
        assert seen(b) == seen(a)
        # the copy is a working ledger: the queued run is claimed by its actor's bound, the
        # forks go on numbered after what they inherit
        queued = b.queued_runs("a-fork-of-fork")
        assert [q.extra["request"]["request_id"] for q in queued] == ["req-1"]
        assert b.actor_load("user:bob").queued == 1
        again, created = b.enqueue_run(
            "a-fork-of-fork", "rev", actor="user:bob", text="later", request_id="req-1"
        )
        assert (again.id, created) == (queued[0].id, False)
        for store in (a, b):
            _turn(store, "b-deep", 10)
        assert dump(b, "b-deep").count("\n") == dump(a, "b-deep").count("\n")
        assert b.last_seq("b-deep") == a.last_seq("b-deep")


def test_forks_copied_without_their_parents(tmp_path: Path, pg_url: str) -> None:
    """A fork copied without the session it was forked from holds what its view holds (no
    more); with a session further up its lineage it stays a fork of that one; two forks that
    would both hold one session's runs are refused, nothing written."""
    with open_ledger(pg_url) as a:
        grow(a, tmp_path)
        before = {s.id: dump(a, s.id) for s in a.sessions()}
        with open_ledger(f"sqlite://{tmp_path}/one.db") as b:
            copy_sessions(a, b, ["a-fork"])
            assert dumps(b) == {"a-fork": before["a-fork"]}
            assert b.fork_of("a-fork") is None
            assert "answer 4" not in dump(b, "a-fork")  # main's turn after the fork
            assert b.erasures() == []  # receipts travel with the whole ledger only
        with open_ledger(f"sqlite://{tmp_path}/two.db") as c:
            copy_sessions(a, c, ["a-fork-of-fork", "main"])
            assert dumps(c) == {k: before[k] for k in ("a-fork-of-fork", "main")}
            assert c.fork_of("a-fork-of-fork") == a.fork_of("a-fork")  # now main's fork
            assert c.notes("a-fork-of-fork", "rev") == a.notes("a-fork-of-fork", "rev")
        with open_ledger(f"sqlite://{tmp_path}/three.db") as d:
            with pytest.raises(UsageError, match=r"both inherit run 'main-t0' of session 'main'"):
                copy_sessions(a, d, ["a-fork-of-fork", "b-deep"])
            assert d.sessions() == []
            copy_sessions(a, d, ["a-fork-of-fork", "b-deep", "main"])
            assert dumps(d) == {k: before[k] for k in ("a-fork-of-fork", "b-deep", "main")}


def test_a_dump_after_an_erasure_holds_every_row(tmp_path: Path) -> None:
    """Erased rows leave seqs unused: a dump (and a copy) reads past them, whatever their
    place among its pages."""
    with open_ledger(f"sqlite://{tmp_path}/a.db") as a, open_ledger("memory:") as b:
        a.create_session("s")
        fence = a.claim_run(a.create_run("s", "rev").id)
        a.append(fence, [NewRow.message("user:ana", msg("user", "go"))], request=True)
        a.append(
            fence,
            [
                NewRow.message(
                    "agent:rev",
                    msg("assistant", f"line {i}"),
                    sources=("repo:gone",) if i in (5, 2400) else (),
                )
                for i in range(2500)
            ],
        )
        a.end_run(fence, RunStatus.FINISHED)
        a.erase(Selector(SelectorKind.SOURCE, "repo:gone"), actor="admin:ana")
        rows = dump(a, "s").count('"type":"row"')
        assert rows == 2501 - 2
        copy_sessions(a, b)
        assert dump(b, "s") == dump(a, "s")
        assert b.last_seq("s") == a.last_seq("s") == 2501
