"""Ledger conformance: every backend in tests/conftest.py BACKENDS passes the same suite."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tether.errors import AlreadyExists, FencedOut, NotFound, RunNotActive, SessionRefusing
from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger
from tether.sizes import canonical_json


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop"}


def started(ledger: Ledger, session: str = "s1", agent: str = "reviewer") -> Any:
    ledger.ensure_session(session)
    run = ledger.create_run(session, agent)
    return ledger.claim_run(run.id)


def test_session_create_get_list(ledger: Ledger) -> None:
    s = ledger.create_session("s1")
    assert ledger.get_session("s1") == s
    with pytest.raises(AlreadyExists):
        ledger.create_session("s1")
    assert ledger.ensure_session("s1") == s
    assert [x.id for x in ledger.sessions()] == ["s1"]
    with pytest.raises(NotFound):
        ledger.get_session("nope")
    assert ledger.last_seq("s1") == 0


def test_append_assigns_dense_seq_and_sizes(ledger: Ledger) -> None:
    fence = started(ledger)
    a = ledger.append(fence, [NewRow.message("user:ana", user("hi"))], request=True)
    b = ledger.append(
        fence,
        [NewRow.message("agent:reviewer", assistant("é" * 10)) for _ in range(3)],
    )
    assert [r.seq for r in a + b] == [1, 2, 3, 4]
    assert ledger.get_run(fence.run).request_seq == 1
    stored = ledger.row("s1", 2)
    assert stored is not None
    assert stored.bytes == len(canonical_json(assistant("é" * 10)).encode())
    assert stored.body == assistant("é" * 10)
    assert stored.actor == "agent:reviewer"
    assert stored.run == fence.run


def test_media_payloads_are_counted_apart(ledger: Ledger) -> None:
    fence = started(ledger)
    img = {"type": "image", "data": "A" * 10_000, "mimeType": "image/png"}
    msg = {"role": "user", "content": [{"type": "text", "text": "see"}, img]}
    [row] = ledger.append(fence, [NewRow.message("user:ana", msg)])
    assert row.media_bytes == 10_000
    stripped = {
        "role": "user",
        "content": [{"type": "text", "text": "see"}, {**img, "data": 10_000}],
    }
    assert row.bytes == len(canonical_json(stripped).encode())


def test_stale_fence_is_rejected_and_writes_nothing(ledger: Ledger) -> None:
    old = started(ledger)
    ledger.append(old, [NewRow.message("user:ana", user("one"))])
    new = ledger.claim_run(old.run)
    assert new.epoch == old.epoch + 1
    with pytest.raises(FencedOut):
        ledger.append(old, [NewRow.message("agent:x", assistant("stale")) for _ in range(5)])
    assert ledger.last_seq("s1") == 1
    with pytest.raises(FencedOut):
        ledger.end_run(old, RunStatus.FINISHED)
    ledger.append(new, [NewRow.message("agent:x", assistant("fresh"))])
    assert ledger.last_seq("s1") == 2


def test_ended_run_takes_no_writes(ledger: Ledger) -> None:
    fence = started(ledger)
    ledger.end_run(fence, RunStatus.FINISHED, extra={"answer_seq": 0})
    with pytest.raises(RunNotActive):
        ledger.append(fence, [NewRow.message("agent:x", assistant("late"))])
    with pytest.raises(RunNotActive):
        ledger.claim_run(fence.run)
    run = ledger.get_run(fence.run)
    assert run.status is RunStatus.FINISHED
    assert run.ended is not None
    assert run.extra == {"answer_seq": 0}
    assert ledger.last_seq("s1") == 0


def test_append_is_idempotent_on_entry_id(ledger: Ledger) -> None:
    fence = started(ledger)
    rows = [NewRow.message("user:ana", user(f"m{i}"), entry_id=f"e{i}") for i in range(3)]
    first = ledger.append(fence, rows[:2])
    again = ledger.append(fence, rows)
    assert [r.seq for r in first] == [1, 2]
    assert [r.seq for r in again] == [1, 2, 3]
    assert ledger.last_seq("s1") == 3


def test_refusing_session_refuses_new_runs(ledger: Ledger) -> None:
    ledger.create_session("s1")
    ledger.set_refusing("s1", "pi idle unconfirmed")
    with pytest.raises(SessionRefusing, match="tether session clear s1"):
        ledger.create_run("s1", "reviewer")
    ledger.set_refusing("s1", None)
    assert ledger.create_run("s1", "reviewer").status is RunStatus.QUEUED


def test_bounded_reads(ledger: Ledger) -> None:
    f1 = started(ledger)
    ledger.append(f1, [NewRow.message("user:ana", user("first request"))], request=True)
    ledger.append(f1, [NewRow.message("agent:r", assistant(f"a{i}")) for i in range(5)])
    compaction = {
        "summary": "so far",
        "covers_to": 6,
        "continuation": {"version": 1, "run": f1.run},
    }
    [c] = ledger.append(f1, [NewRow("agent:r", RowKind.COMPACTION, compaction, ("repo:a",))])
    ledger.end_run(f1, RunStatus.FINISHED)
    f2 = started(ledger)
    ledger.append(f2, [NewRow.message("user:ana", user("second"))], request=True)
    ledger.append(f2, [NewRow.message("agent:r", assistant("x" * 100)) for _ in range(20)])

    latest = ledger.latest_compaction("s1")
    assert latest is not None
    assert latest.seq == c.seq == 7
    assert latest.covers_to == 6
    assert latest.sources == ("repo:a",)

    ended = ledger.last_ended_run("s1", "reviewer")
    assert ended is not None
    assert ended.id == f1.run
    assert ended.request_seq == 1
    assert ledger.last_ended_run("s1", "other") is None

    assert ledger.row("s1", 8) is not None
    assert ledger.row("s1", 999) is None

    size = ledger.row("s1", 28)
    assert size is not None
    tail = ledger.tail("s1", size.bytes * 3)
    assert [r.seq for r in tail.rows] == [26, 27, 28]
    assert tail.stop_seq == 25
    assert tail.bytes == size.bytes * 3
    floor = ledger.tail("s1", 10**9, after=20)
    assert [r.seq for r in floor.rows] == list(range(21, 29))
    assert floor.stop_seq is None
    capped = ledger.tail("s1", 10**9, max_rows=4)
    assert [r.seq for r in capped.rows] == [25, 26, 27, 28]

    assert [r.seq for r in ledger.rows_range("s1", 5, 12, limit=3)] == [5, 6, 7]


def test_tail_pages_through_long_sessions(ledger: Ledger) -> None:
    fence = started(ledger)
    ledger.append(fence, [NewRow.message("agent:r", assistant(str(i))) for i in range(700)])
    tail = ledger.tail("s1", 10**9)
    assert [r.seq for r in tail.rows] == list(range(1, 701))


def test_notes_are_bounded_by_count_and_bytes(ledger: Ledger) -> None:
    ledger.create_session("s1")
    for i in range(10):
        ledger.add_note("s1", "reviewer", f"note {i} " + "x" * 90)
    ledger.add_note("s1", "other", "not mine")
    picked = ledger.notes("s1", "reviewer", max_count=4, max_bytes=10_000)
    assert [n.text.split()[1] for n in picked] == ["6", "7", "8", "9"]
    by_bytes = ledger.notes("s1", "reviewer", max_count=100, max_bytes=250)
    assert [n.text.split()[1] for n in by_bytes] == ["8", "9"]


def test_runs_listed_in_creation_order(ledger: Ledger) -> None:
    ledger.create_session("s1")
    ids = [ledger.create_run("s1", "a", run_id=f"run{i}").id for i in range(5)]
    assert [r.id for r in ledger.runs("s1")] == ids
    with pytest.raises(AlreadyExists):
        ledger.create_run("s1", "a", run_id="run0")


def test_racing_owners_never_interleave_a_batch(ledger_url: str) -> None:
    """Two owners of one run race: each append is all-or-nothing, and once the second owner has
    claimed the run the first one's writes are rejected."""
    if ledger_url == "memory:":
        a = b = open_ledger(ledger_url)  # one in-memory database: share it between the threads
    else:
        a, b = open_ledger(ledger_url), open_ledger(ledger_url)
    try:
        a.create_session("s1")
        run = a.create_run("s1", "reviewer")
        first = a.claim_run(run.id)
        results: dict[str, list[int]] = {"a": [], "b": []}
        errors: list[BaseException] = []
        go = threading.Barrier(2)

        def owner_a() -> None:
            go.wait()
            for i in range(200):
                try:
                    rows = a.append(
                        first, [NewRow.message("agent:a", assistant(f"a{i}.{k}")) for k in range(5)]
                    )
                except FencedOut:
                    return
                except BaseException as exc:
                    errors.append(exc)
                    return
                results["a"].append(rows[0].seq)

        def owner_b() -> None:
            go.wait()
            second = b.claim_run(run.id)
            for i in range(50):
                rows = b.append(
                    second, [NewRow.message("agent:b", assistant(f"b{i}.{k}")) for k in range(5)]
                )
                results["b"].append(rows[0].seq)

        threads = [threading.Thread(target=owner_a), threading.Thread(target=owner_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        rows = list(a.iter_rows("s1"))
        assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
        # batches are contiguous and single-owner
        for i in range(0, len(rows), 5):
            assert len({r.actor for r in rows[i : i + 5]}) == 1
        a_rows = [r for r in rows if r.actor == "agent:a"]
        b_rows = [r for r in rows if r.actor == "agent:b"]
        assert len(a_rows) == 5 * len(results["a"])
        assert len(b_rows) == 250
        # no write of the stale owner lands after the new owner's first write
        if a_rows:
            assert a_rows[-1].seq < b_rows[0].seq
    finally:
        a.close()
        if b is not a:
            b.close()


def test_sqlite_reads_the_newest_compaction_through_its_partial_index(tmp_path: Any) -> None:
    """Without statistics SQLite once chose the (session, seq, bytes) index for this read and
    walked the whole session: 397 ms at 10^6 rows in bench/ledger.py instead of 12 µs."""
    from tether.ledger.codec import ROW_COLS
    from tether.ledger.sqlite import SQLiteLedger

    ledger = open_ledger(f"sqlite:{tmp_path}/l.db")
    assert isinstance(ledger, SQLiteLedger)
    with ledger, ledger._read() as c:
        c.execute(
            f"EXPLAIN QUERY PLAN SELECT {ROW_COLS} FROM rows {ledger._compactions_hint} "
            "WHERE session = ? AND kind = 'compaction' ORDER BY seq DESC LIMIT 1",
            ("s",),
        )
        plan = " ".join(str(r[-1]) for r in c.fetchall())
    assert "rows_compactions" in plan, plan


@pytest.mark.parametrize("sizes", [(1, 3, 64, 100, 130, 2)])
def test_batches_of_any_size_are_stored_and_indexed_in_step(
    ledger: Ledger, sizes: tuple[int, ...]
) -> None:
    """Appends of many rows are inserted a few statements at a time (SQLite): every row lands
    with its seq, body and size, and the full-text index holds each one, whatever the batch's
    size against the statements' (powers of two up to 64)."""
    fence = started(ledger)
    seq = 0
    for n in sizes:
        rows = [NewRow.message("user:ana", user(f"word{seq + i + 1}x common")) for i in range(n)]
        written = ledger.append(fence, rows)
        assert [r.seq for r in written] == list(range(seq + 1, seq + n + 1))
        seq += n
    stored = ledger.rows_range("s1", 1, seq, limit=seq)
    assert [r.seq for r in stored] == list(range(1, seq + 1))
    for r in stored:
        assert r.body == user(f"word{r.seq}x common")
        assert r.bytes == len(canonical_json(r.body).encode())
    for probe in (1, 2, 4, 5, 67, 68, 100, 167, 168, 297, 298, seq):
        hits = ledger.search("s1", [f"word{probe}x"])
        assert [h.row.seq for h in hits] == [probe]
    assert len(ledger.search("s1", ["common"], limit=seq)) == seq


def test_sqlite_appends_a_batch_in_few_statements(tmp_path: Any) -> None:
    """FTS5 writes a new index segment at each statement: a statement a row (executemany) made a
    segment a row and took three quarters of an append's time (bench/ledger.py); a trigger on
    statements of 64 rows, a segment a statement. The ledger indexes an append in one."""
    from tether.ledger.sqlite import SQLiteLedger

    ledger = open_ledger(f"sqlite:{tmp_path}/l.db")
    assert isinstance(ledger, SQLiteLedger)
    with ledger:
        fence = started(ledger)
        statements: list[str] = []
        ledger._conn.set_trace_callback(statements.append)
        ledger.append(fence, [NewRow.message("user:ana", user(f"w{i}")) for i in range(200)])
        ledger._conn.set_trace_callback(None)
        # A new segment writes its first entry in rows_fts_idx (a statement the trace shows).
        segments = [s for s in statements if "INSERT INTO 'main'.'rows_fts_idx'" in s]
        assert len(segments) == 1
        assert sum("INSERT INTO rows " in s for s in statements) == 4  # 64 + 64 + 64 + 8 rows
        with ledger._tx() as c:  # raises when the index and the rows' text disagree
            c.execute("INSERT INTO rows_fts (rows_fts, rank) VALUES ('integrity-check', 1)")


def test_sqlite_full_text_index_keeps_step_with_appends_copies_and_erasures(
    tmp_path: Any,
) -> None:
    """The ledger fills rows_fts itself (no insert trigger): every writer of rows (append,
    import, copy) indexes what it wrote, in its transaction, and an erasure removes it."""
    from tether.ledger.copy import copy_sessions
    from tether.ledger.lifecycle import Selector, SelectorKind
    from tether.ledger.sqlite import SQLiteLedger

    def in_step(ledger: SQLiteLedger) -> int:
        with ledger._tx() as c:  # raises when the index and the rows' text disagree
            c.execute("INSERT INTO rows_fts (rows_fts, rank) VALUES ('integrity-check', 1)")
            c.execute("SELECT count(*) FROM rows_fts")
            return int(c.fetchone()[0])

    src = open_ledger(f"sqlite:{tmp_path}/a.db")
    dst = open_ledger(f"sqlite:{tmp_path}/b.db")
    assert isinstance(src, SQLiteLedger)
    assert isinstance(dst, SQLiteLedger)
    with src, dst:
        for sid in ("s1", "s2"):
            fence = started(src, sid)
            src.append(
                fence, [NewRow.message("user:ana", user(f"{sid}w{i} both")) for i in range(70)]
            )
            src.append(fence, [NewRow.message("user:ana", user(f"{sid}late"))], request=True)
            src.end_run(fence, RunStatus.FINISHED)
        assert in_step(src) == 142
        copy_sessions(src, dst)
        assert in_step(dst) == 142
        for ledger in (src, dst):
            assert [h.row.seq for h in ledger.search("s2", ["s2w69"])] == [70]
            assert [h.row.seq for h in ledger.search("s1", ["s1late"])] == [71]
            assert len(ledger.search("s1", ["both"], limit=200)) == 70
        dst.erase(Selector(SelectorKind.SESSION, "s1"), actor="user:op")
        assert in_step(dst) == 71
        assert dst.search("s2", ["s1w3"]) == []
        assert len(dst.search("s2", ["both"], limit=200)) == 70
        # A row appended after the erasure is indexed under its own key, beside the others.
        fence = started(dst, "s3")
        dst.append(fence, [NewRow.message("user:ana", user("s3only both"))])
        assert [h.row.seq for h in dst.search("s3", ["s3only"])] == [1]
        assert in_step(dst) == 72


def test_rows_with_copy_format_specials_round_trip_and_are_found(ledger: Ledger) -> None:
    """PostgreSQL takes rows with COPY, whose text format gives tabs, newlines, backslashes and
    \\N meanings of their own: a row holding them reads back exactly, and its words are found."""
    fence = started(ledger)
    text = 'tab\there\nnewline \\N back\\slash "quoted" \r\u00e9t\u00e9 \\. zebraword'
    extra = {"k": "a\tb\\N"}
    [row] = ledger.append(
        fence, [NewRow.message("user:ana", user(text), sources=("x\\y",), extra=extra)]
    )
    [stored] = ledger.rows_range("s1", row.seq, row.seq)
    assert stored.body == user(text)
    assert stored.extra == extra
    assert stored.sources == ("x\\y",)
    assert stored.bytes == len(canonical_json(user(text)).encode())
    assert [h.row.seq for h in ledger.search("s1", ["zebraword"])] == [row.seq]
