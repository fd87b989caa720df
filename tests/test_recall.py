"""The recall API and notes on every ledger backend: ranked search over the whole session, exact
ranges, admission, the byte bounds of every answer, the index kept in sync on append, import and
copy, notes with their actor and sources; and the harness's tool socket."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import anyio
import anyio.abc
import pytest

from followup_sessions import RunWriter
from tether.access import Obligations
from tether.config import FollowupConfig
from tether.errors import RecallError
from tether.followup import FollowupView, build_view
from tether.harness.tools import ToolServer
from tether.ledger import Ledger, open_ledger
from tether.ledger.jsonl import dump_session, load_file
from tether.pi.toolchannel import ToolChannel
from tether.recall import (
    MAX_ANSWER_BYTES,
    MAX_HITS,
    MAX_SNIPPET_BYTES,
    RecallAnswer,
    add_note,
    read_range,
    search,
)

GRANTS = {"user:ana": ["repo:*"], "user:bob": []}


def sizes(answer: RecallAnswer) -> tuple[int, int]:
    text = len(answer.to_text().encode("utf-8"))
    js = len(json.dumps(answer.to_json(), ensure_ascii=False, separators=(",", ":")).encode())
    return text, js


def history(ledger: Ledger) -> RunWriter:
    """Request, a secret early, a checkpoint over it, more work after."""
    w = RunWriter.start(ledger, "s1", "rev")
    w.request("Look at the deploy")
    w.say("Early: the rollback token is quokka-991.")
    w.say("Private: the signing key lives in vault path kv/quokka.", sources=("repo:acme/keys",))
    w.checkpoint("Summary: looked at the deploy.")
    for i in range(5):
        w.say(f"Later remark {i} about nothing in particular.")
    w.end()
    return w


def test_search_reaches_rows_a_checkpoint_covers_and_ranks_them(ledger: Ledger) -> None:
    w = history(ledger)
    answer = search(ledger, "s1", "quokka rollback", actor="user:ana", grants=GRANTS)
    seqs = [h.seq for h in answer.hits]
    assert seqs[0] == w.rows[1].seq, "the row holding both words ranks first"
    assert set(seqs) == {w.rows[1].seq, w.rows[2].seq}
    assert "quokka-991" in answer.hits[0].snippet
    assert answer.sources == ("repo:acme/keys",)
    assert "[tether: quoted evidence" in answer.to_text()
    assert search(ledger, "s1", "QUOKKA", actor="user:ana", grants=GRANTS).hits


def test_search_names_withheld_rows_and_never_shows_them(ledger: Ledger) -> None:
    w = history(ledger)
    answer = search(ledger, "s1", "quokka", actor="user:bob", grants=GRANTS)
    private = w.rows[2].seq
    assert [h.seq for h in answer.hits] == [w.rows[1].seq]
    assert answer.withheld == ((private, private),)
    assert "kv/quokka" not in answer.to_text()
    assert "kv/quokka" not in json.dumps(answer.to_json())
    assert answer.sources == ()


def test_search_takes_no_query_syntax(ledger: Ledger) -> None:
    history(ledger)
    for query in ['"unbalanced', "a OR NOT b*", "kv/quokka) AND (", "NEAR(x y)"]:
        search(ledger, "s1", query, actor="user:ana", grants=GRANTS)
    with pytest.raises(RecallError):
        search(ledger, "s1", " ?! ", actor="user:ana", grants=GRANTS)


def test_a_search_looks_for_its_first_words_however_they_are_joined(ledger: Ledger) -> None:
    # One token can hold thousands of words (a.b.c…): the cap applies to the words searched,
    # so the query stays small (PostgreSQL takes at most 65,535 parameters).
    history(ledger)
    joined = ".".join(["quokka", *(f"w{i}" for i in range(5_000)), "rollback"])
    answer = search(ledger, "s1", joined, actor="user:ana", grants=GRANTS)
    assert answer.hits, "quokka is among the first words"
    assert answer.query is not None
    assert len(answer.query) <= 201, "named by its start"
    assert not ledger.search("s1", [".".join([*(f"w{i}" for i in range(16)), "rollback"])])


def _one_run(ledger: Ledger, request: str, answers: list[str]) -> None:
    """A finished run of rev on s1: the request, then each answer as a row of its own."""
    w = RunWriter.start(ledger, "s1", "rev")
    w.request(request)
    for text in answers:
        w.say(text)
    w.end()


def test_search_answers_stay_within_their_bounds(ledger: Ledger) -> None:
    _one_run(ledger, "Big rows", [f"needle {i} " + '\u00e9"\n' * 30_000 for i in range(20)])
    answer = search(ledger, "s1", "needle", actor=None, grants={})
    assert len(answer.hits) == MAX_HITS
    assert all(len(h.snippet.encode()) <= MAX_SNIPPET_BYTES for h in answer.hits)
    assert max(sizes(answer)) <= MAX_ANSWER_BYTES


def test_a_range_is_cut_at_the_bound_with_the_next_seq(ledger: Ledger) -> None:
    _one_run(ledger, "Many rows", [f"row text {i} " + "x" * 700 for i in range(60)])
    answer = read_range(ledger, "s1", 2, 61, actor=None, grants={})
    assert max(sizes(answer)) <= MAX_ANSWER_BYTES
    assert answer.next is not None
    assert [r.seq for r in answer.rows] == list(range(2, answer.next))
    assert f'recall({{"from":{answer.next},"to":61}})' in answer.to_text()
    rest = read_range(ledger, "s1", answer.next, 61, actor=None, grants={})
    assert rest.rows[0].seq == answer.next


def test_a_row_too_big_for_an_answer_is_cut_and_flagged(ledger: Ledger) -> None:
    w = RunWriter.start(ledger, "s1", "rev")
    w.request("One huge row")
    big = w.say("start " + "\U0001f600" * 20_000)
    w.say("after")
    w.end()
    answer = read_range(ledger, "s1", big.seq, big.seq + 1, actor=None, grants={})
    assert max(sizes(answer)) <= MAX_ANSWER_BYTES
    assert answer.rows[0].truncated
    assert answer.rows[0].text.startswith("start ")
    assert answer.next == big.seq + 1


def test_a_range_names_withheld_rows_and_past_the_end(ledger: Ledger) -> None:
    w = history(ledger)
    private = w.rows[2].seq
    last = ledger.last_seq("s1")
    answer = read_range(ledger, "s1", 1, last + 5, actor="user:bob", grants=GRANTS)
    assert private not in [r.seq for r in answer.rows]
    # The checkpoint after it carries the sources of what it covers: withheld like it.
    assert answer.withheld == ((private, private + 1),)
    assert f"The session has rows 1–{last}." in answer.to_text()
    assert "kv/quokka" not in answer.to_text()
    with pytest.raises(RecallError):
        read_range(ledger, "s1", 5, 2, actor=None, grants={})


def test_the_index_follows_imports_and_dumps(ledger: Ledger, tmp_path: Path) -> None:
    history(ledger)
    out = io.StringIO()
    dump_session(ledger, "s1", out)
    dumped = (
        out.getvalue().replace('"id":"s1"', '"id":"s2"').replace('"session":"s1"', '"session":"s2"')
    )
    dumped = "\n".join(line for line in dumped.splitlines() if '"type":"run"' not in line).replace(
        '"run":"', '"was_run":"'
    )
    (tmp_path / "s2.jsonl").write_text(dumped + "\n")
    load_file(ledger, tmp_path / "s2.jsonl")
    hits = search(ledger, "s2", "rollback", actor=None, grants={}).hits
    assert [h.snippet for h in hits] == ["Early: the rollback token is quokka-991."]
    assert search(ledger, "s1", "rollback", actor=None, grants={}).hits[0].seq == 2


def test_a_load_of_several_sessions_in_one_batch_indexes_every_row_once(tmp_path: Path) -> None:
    # One batch of rows of two sessions: their keys in the full-text index are not one range.
    with open_ledger(f"sqlite://{tmp_path}/a.db") as source:
        history(source)
        out = io.StringIO()
        dump_session(source, "s1", out)
    first = "\n".join(line for line in out.getvalue().splitlines() if '"type":"run"' not in line)
    first = first.replace('"run":"', '"was_run":"')
    second = first.replace('"id":"s1"', '"id":"s2"').replace('"session":"s1"', '"session":"s2"')
    second = second.replace("quokka-991", "wombat-12")
    (tmp_path / "both.jsonl").write_text(first + "\n" + second + "\n")
    with open_ledger(f"sqlite://{tmp_path}/b.db") as ledger:
        load_file(ledger, tmp_path / "both.jsonl")
        conn = ledger._conn  # type: ignore[attr-defined]
        # FTS5 compares its index with the rows' text, row by row
        conn.execute("INSERT INTO rows_fts (rows_fts, rank) VALUES ('integrity-check', 1)")
        rows = conn.execute("SELECT count(*) FROM rows").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM rows_fts").fetchone()[0] == rows
        hits = search(ledger, "s2", "rollback", actor=None, grants={}).hits
        assert [h.snippet for h in hits] == ["Early: the rollback token is wombat-12."]
        hits = search(ledger, "s1", "rollback", actor=None, grants={}).hits
        assert [h.snippet for h in hits] == ["Early: the rollback token is quokka-991."]


def _unkey_rows(conn: sqlite3.Connection) -> None:
    """Undo schema 11's rows keyed by their full-text key: rows.id again, with its unique
    (session, seq) and rows_fts_key."""
    cols = "session, seq, run, actor, kind, body, sources, bytes, media_bytes, entry_id, extra"
    conn.execute("ALTER TABLE rows RENAME TO rows_keyed")
    conn.execute(
        "CREATE TABLE rows (id INTEGER PRIMARY KEY AUTOINCREMENT, "
        "session TEXT NOT NULL REFERENCES sessions(id), seq INTEGER NOT NULL, "
        "run TEXT REFERENCES runs(id), actor TEXT NOT NULL, kind TEXT NOT NULL, "
        "body TEXT NOT NULL, sources TEXT NOT NULL DEFAULT '[]', bytes INTEGER NOT NULL, "
        "media_bytes INTEGER NOT NULL DEFAULT 0, entry_id TEXT, "
        "extra TEXT NOT NULL DEFAULT '{}', text TEXT NOT NULL DEFAULT '', fts_key INTEGER, "
        "UNIQUE (session, seq))"
    )
    conn.execute(
        f"INSERT INTO rows ({cols}, text, fts_key) SELECT {cols}, text, fts_key "
        "FROM rows_keyed ORDER BY fts_key"
    )
    conn.execute("DROP TABLE rows_keyed")
    conn.execute("CREATE UNIQUE INDEX rows_fts_key ON rows (fts_key)")
    conn.execute(
        "CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL"
    )
    conn.execute("CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction'")
    conn.execute("CREATE INDEX rows_by_run ON rows (run, seq)")
    conn.execute("CREATE INDEX rows_heads ON rows (session, seq, bytes, sources)")


def _drop_session_keys(conn: sqlite3.Connection) -> None:
    """Undo schema 15's chat bridges, 14's usage, 13's webhook outbox, 12's run actors, 11's
    keyed rows, 9's forks and erasure receipts, 8's index of row heads and 7's session numbers
    and row keys."""
    for table in ("bridge_outbox", "bridge_events", "bridge_cursors", "bridge_threads"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("DROP TABLE run_usage")
    conn.execute("DROP TABLE webhook_deliveries")
    conn.execute("DROP TABLE webhook_events")
    conn.execute("DROP INDEX runs_open_by_actor")
    conn.execute("DROP INDEX runs_by_actor")
    for col in ("actor", "created_epoch"):
        conn.execute(f"ALTER TABLE runs DROP COLUMN {col}")
    _unkey_rows(conn)
    conn.execute("DROP TABLE erasures")
    conn.execute("DROP INDEX sessions_by_parent")
    for col in ("parent", "fork_seq", "fork_ord", "fork_note"):
        conn.execute(f"ALTER TABLE sessions DROP COLUMN {col}")
    conn.execute("DROP INDEX rows_heads")
    conn.execute("CREATE INDEX rows_sizes ON rows (session, seq, bytes)")
    conn.execute("DROP TRIGGER sessions_num")
    conn.execute("DROP INDEX sessions_num")
    conn.execute("DROP INDEX rows_fts_key")
    conn.execute("ALTER TABLE sessions DROP COLUMN num")
    conn.execute("ALTER TABLE rows DROP COLUMN fts_key")


def test_an_existing_sqlite_ledger_is_indexed_when_it_migrates(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with open_ledger(f"sqlite://{db}") as ledger:
        history(ledger)
    conn = sqlite3.connect(db)
    with conn:  # back to schema 4 (custody's): no full-text table, no note columns
        conn.execute("DROP TRIGGER rows_fts_delete")
        conn.execute("DROP TABLE rows_fts")
        _drop_session_keys(conn)
        for col in ("actor", "run", "sources"):
            conn.execute(f"ALTER TABLE notes DROP COLUMN {col}")
        conn.execute("PRAGMA user_version = 4")
    conn.close()
    with open_ledger(f"sqlite://{db}") as ledger:
        assert search(ledger, "s1", "rollback", actor=None, grants={}).hits[0].seq == 2


def test_notes_are_bounded_attributed_and_admitted(ledger: Ledger) -> None:
    history(ledger)
    with pytest.raises(RecallError, match="2000-byte limit"):
        add_note(ledger, "s1", "rev", "é" * 1001)
    with pytest.raises(RecallError):
        add_note(ledger, "s1", "rev", "  \n")
    add_note(ledger, "s1", "rev", "open note", actor="user:ana", run="r-1")
    add_note(
        ledger, "s1", "rev", "from keys", actor="user:ana", run="r-2", sources=("repo:acme/keys",)
    )
    notes = ledger.notes("s1", "rev")
    assert [(n.text, n.actor, n.run, n.sources) for n in notes] == [
        ("open note", "user:ana", "r-1", ()),
        ("from keys", "user:ana", "r-2", ("repo:acme/keys",)),
    ]

    def view(actor: str) -> FollowupView:
        found = build_view(
            ledger, session="s1", agent="rev", actor=actor, config=FollowupConfig(), grants=GRANTS
        )
        assert isinstance(found, FollowupView)
        return found

    ana, bob = view("user:ana"), view("user:bob")
    ana_text, bob_text = json.dumps(ana.to_json()), json.dumps(bob.to_json())
    assert "from keys" in ana_text
    assert "repo:acme/keys" in ana.sources
    assert "open note" in bob_text
    assert "from keys" not in bob_text
    out = io.StringIO()
    dump_session(ledger, "s1", out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    dumped = [r for r in records if r["type"] == "note"]
    assert dumped[1]["actor"] == "user:ana"
    assert dumped[1]["sources"] == ["repo:acme/keys"]


async def ask(socket: Path, payload: dict[str, object]) -> dict[str, object]:
    """One request to a run's tool socket, as pi's tools extension sends it, and the reply."""
    async with await anyio.connect_unix(socket) as stream:
        await stream.send(json.dumps(payload).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            data += await stream.receive()
    reply: dict[str, object] = json.loads(data)
    return reply


def test_the_tool_socket_is_private_and_asks_for_the_token(tmp_path: Path) -> None:
    with open_ledger(f"sqlite://{tmp_path}/l.db") as ledger:
        w = history(ledger)
        run = ledger.create_run("s1", "rev")
        fence = ledger.claim_run(run.id)
        obligations = Obligations()
        server = ToolServer(
            ledger=ledger,
            grants=GRANTS,
            fence=fence,
            agent="rev",
            actor="user:ana",
            obligations=obligations,
            channel=ToolChannel.new(tmp_path / "run"),
        )
        (tmp_path / "run").mkdir(exist_ok=True)  # ToolChannel.new made it (its sock/ inside)

        async def call(payload: dict[str, object]) -> dict[str, object]:
            return await ask(server.path, payload)

        async def go() -> list[dict[str, object]]:
            async with anyio.create_task_group() as tg:
                await tg.start(server.serve)
                assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
                replies = [
                    await call({"token": "nope", "tool": "recall", "args": {"query": "quokka"}}),
                    await call(
                        {"token": server.token, "tool": "recall", "args": {"query": "quokka"}}
                    ),
                    await call({"token": server.token, "tool": "forget", "args": {}}),
                    await call(
                        {"token": server.token, "tool": "recall", "args": {"from": "2", "to": 3}}
                    ),
                ]
                tg.cancel_scope.cancel()
            return replies

        refused, found, unknown, ranged = anyio.run(go)
        assert refused == {"ok": False, "error": "the capability token is not this run's"}
        assert found["ok"] is True
        assert "quokka-991" in str(found["text"])
        assert unknown["ok"] is False
        assert "kv/quokka" in str(ranged["text"])
        assert obligations.sources == ("repo:acme/keys",)
        assert not server.path.exists(), "the socket is removed when the run ends"
        assert w.rows


def test_a_takeover_serves_the_tool_socket_again_and_the_lost_server_leaves_it_alone(
    tmp_path: Path,
) -> None:
    # A run directory too deep for a socket path: the socket gets a private directory of its
    # own in the system's temporary directory, which a takeover must serve again.
    run_dir = tmp_path / ("d" * 100) / "run"
    run_dir.mkdir(parents=True)
    first = ToolChannel.new(run_dir)
    assert first.private_dir is not None
    again = ToolChannel.again(first.path, first.token)
    assert again.private_dir == first.private_dir
    with open_ledger(f"sqlite://{tmp_path}/l.db") as ledger:
        history(ledger)
        run = ledger.create_run("s1", "rev")
        fence = ledger.claim_run(run.id)

        def server(channel: ToolChannel) -> ToolServer:
            return ToolServer(
                ledger=ledger,
                grants=GRANTS,
                fence=fence,
                agent="rev",
                actor="user:ana",
                obligations=Obligations(),
                channel=channel,
            )

        lost, taker = server(first), server(again)

        async def call() -> dict[str, object]:
            payload = {"token": first.token, "tool": "recall", "args": {"query": "quokka"}}
            return await ask(first.path, payload)

        async def go() -> tuple[dict[str, object], dict[str, object]]:
            async with anyio.create_task_group() as tg:
                lost_scope = anyio.CancelScope()

                async def serve_lost(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                    with lost_scope:
                        await lost.serve(task_status=task_status)

                await tg.start(serve_lost)
                await tg.start(taker.serve)  # the takeover binds its own socket there
                lost_scope.cancel()  # the lost harness ends after the takeover
                await anyio.sleep(0.05)
                after_lost = await call()
                tg.cancel_scope.cancel()
            assert not first.path.exists(), "the takeover removes its socket when it ends"
            assert first.private_dir is not None
            assert not first.private_dir.exists()
            # A takeover after the lost harness removed the socket's directory makes it again.
            async with anyio.create_task_group() as tg:
                await tg.start(server(again).serve)
                assert first.private_dir.stat().st_mode & 0o777 == 0o700
                remade = await call()
                tg.cancel_scope.cancel()
            return after_lost, remade

        after_lost, remade = anyio.run(go)
        assert after_lost["ok"] is True, after_lost
        assert remade["ok"] is True, remade
        assert not first.private_dir.exists()


@pytest.mark.parametrize("how", ["open to others", "another user's"])
def test_a_takeover_serves_no_socket_in_a_directory_that_is_not_private(
    tmp_path: Path, how: str
) -> None:
    # The socket's directory in the temporary directory was removed with the lost harness,
    # and someone made one at that name before the takeover: its socket would be theirs to
    # replace, so none is bound there (pi's tool calls fail; the run goes on).
    run_dir = tmp_path / ("d" * 100) / "run"
    run_dir.mkdir(parents=True)
    first = ToolChannel.new(run_dir)
    assert first.private_dir is not None
    if how == "open to others":
        first.private_dir.chmod(0o755)
    else:
        if os.getuid() != 0:
            pytest.skip("giving a directory to another user takes root")
        os.chown(first.private_dir, 65534, 65534)
    try:
        with open_ledger(f"sqlite://{tmp_path}/l.db") as ledger:
            ledger.ensure_session("s1")
            run = ledger.create_run("s1", "rev")
            server = ToolServer(
                ledger=ledger,
                grants=GRANTS,
                fence=ledger.claim_run(run.id),
                agent="rev",
                actor="user:ana",
                obligations=Obligations(),
                channel=ToolChannel.again(first.path, first.token),
            )

            async def go() -> None:
                with anyio.fail_after(10):
                    await server.serve()  # reports started and returns at once

            anyio.run(go)
        assert not first.path.exists()
        assert first.private_dir.exists(), "someone else's directory is left alone"
    finally:
        shutil.rmtree(first.private_dir, ignore_errors=True)
