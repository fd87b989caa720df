"""Forks by reference (docs/operations.md#erasure-and-retention), on every backend: at every run of
a session, a fork's
views, rows, recall and notes equal those of a session copied up to the end of that run, before
and after both go on; the session forked is unchanged; a fork of a fork; erasing in the session
erases what its forks inherit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tether.config import FollowupConfig
from tether.errors import AlreadyExists, NotFound, UsageError
from tether.followup import FollowupView, Refused, build_view
from tether.ledger import Ledger, NewRow, Row, RowKind, Run, RunStatus
from tether.ledger.lifecycle import Selector, SelectorKind
from tether.ledger.models import now_iso
from tether.recall import read_range, search

GRANTS = {"user:ana": ["*"], "user:bob": ["repo:open/*"]}
AGENTS = ("rev", "ops")


def _msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}


def _turn(
    ledger: Ledger, session: str, i: int, *, agent: str | None = None, at: str | None = None
) -> Run:
    """Turn ``i``: a request, a few answers of varying size and sources, now and then a
    compaction over everything before it, and a note."""
    agent = agent or AGENTS[i % 2]
    ledger.ensure_session(session)
    fence = ledger.claim_run(ledger.create_run(session, agent).id)
    src = ("repo:open/a",) if i % 3 else ("repo:closed/b",)
    ledger.append(
        fence, [NewRow.message("user:ana", _msg("user", f"request {i} word{i}"))], request=True
    )
    rows = [
        NewRow.message(
            f"agent:{agent}", _msg("assistant", f"answer {i}.{k} " + "x" * (i * 97 % 700))
        )
        for k in range(1 + i % 3)
    ]
    rows[-1] = NewRow.message(rows[-1].actor, rows[-1].body, sources=src)
    if i % 4 == 3:
        covers = ledger.last_seq(session) + len(rows)
        rows.append(
            NewRow(
                actor=f"agent:{agent}",
                kind=RowKind.COMPACTION,
                body={"summary": f"summary {i}", "covers_to": covers, "tokens_before": 10},
            )
        )
    ledger.append(fence, rows)
    if i % 2:
        ledger.add_note(session, agent, f"note {i}", at=at, actor="user:ana", run=fence.run)
    return ledger.end_run(fence, RunStatus.FINISHED if i % 5 else RunStatus.FAILED)


def _copy(ledger: Ledger, source: str, upto: Run, new: str) -> dict[str, str]:
    """``source`` up to the end of ``upto`` written again as ``new``, through the ordinary
    writes: the copy a fork must equal. Returns the copy's run ids → the source's."""
    ledger.ensure_session(new)
    names: dict[str, str] = {}
    notes = ledger.all_notes(source)
    for run in ledger.runs(source):
        fence = ledger.claim_run(ledger.create_run(new, run.agent).id)
        names[fence.run] = run.id
        rows = [r for r in ledger.iter_rows(source) if r.run == run.id]
        request = [r for r in rows if r.seq == run.request_seq]
        for r in request:
            ledger.append(fence, [_new(r)], request=True)
        rest = [_new(r) for r in rows if r.seq != run.request_seq]
        if rest:
            ledger.append(fence, rest)
        for n in notes:
            if n.run == run.id:
                ledger.add_note(new, n.agent, n.text, at=n.at, actor=n.actor, run=fence.run)
        ledger.end_run(fence, run.status)
        if run.id == upto.id:
            break
    return names


def _new(r: Row) -> NewRow:
    # The sources a compaction carries are the union of what it covers, stamped at write:
    # the copy's are stamped again from the copied rows.
    own = () if r.kind is RowKind.COMPACTION else r.sources
    return NewRow(actor=r.actor, kind=r.kind, body=r.body, sources=own)


def _seen(ledger: Ledger, session: str, names: dict[str, str]) -> str:
    """Everything a reader of the session gets, as one text: the views of each agent for each
    actor at a few budgets, the rows, recall (a search and a range), the notes, the last seq;
    the session's and the copy's run ids written as the source's."""
    out: dict[str, Any] = {"last_seq": ledger.last_seq(session)}
    for agent in AGENTS:
        for actor in GRANTS:
            for budget in (1_500, 6_000, 200_000):
                view = build_view(
                    ledger,
                    session=session,
                    agent=agent,
                    actor=actor,
                    request="and now?",
                    config=FollowupConfig(budget_bytes=budget),
                    grants=GRANTS,
                )
                key = f"{agent} {actor} {budget}"
                out[key] = view.to_json() if isinstance(view, FollowupView | Refused) else view
        out[f"notes {agent}"] = [(n.text, n.actor, n.run) for n in ledger.notes(session, agent)]
    out["rows"] = [r._replace(session="SESSION") for r in ledger.iter_rows(session)]
    out["search"] = search(ledger, session, "word3 answer", actor="user:bob", grants=GRANTS).hits
    out["range"] = read_range(ledger, session, 1, 10_000, actor="user:bob", grants=GRANTS).rows
    out["runs"] = [(r.agent, r.status, r.request_seq) for r in ledger.runs(session)]
    text = json.dumps(out, default=repr, sort_keys=True).replace(session, "SESSION")
    for mine, theirs in names.items():
        text = text.replace(mine, theirs)
    return text


def test_a_fork_reads_as_a_copy_at_every_run_and_after_both_go_on(ledger: Ledger) -> None:
    runs = [_turn(ledger, "main_s", i) for i in range(1, 10)]
    before = _seen(ledger, "main_s", {})
    for k, at in enumerate(runs):
        names = _copy(ledger, "main_s", at, f"copy_{k}")
        made = ledger.fork_session("main_s", at.id, f"fork_{k}")
        assert made.id == f"fork_{k}"
        assert ledger.fork_of(f"fork_{k}") == ("main_s", ledger.last_seq(f"copy_{k}"))
        assert _seen(ledger, f"fork_{k}", {}) == _seen(ledger, f"copy_{k}", names)
        # Both go on alike: their own runs, checkpoints and notes.
        for i in (10 + k, 11 + k, 12 + k):
            at = now_iso()
            own = _turn(ledger, f"fork_{k}", i, at=at)
            mirror = _turn(ledger, f"copy_{k}", i, at=at)
            names[mirror.id] = own.id
        assert _seen(ledger, f"fork_{k}", {}) == _seen(ledger, f"copy_{k}", names)
    # The session forked is unchanged.
    assert _seen(ledger, "main_s", {}) == before


def test_a_fork_of_a_fork_and_the_refusals(ledger: Ledger) -> None:
    runs = [_turn(ledger, "main_s", i) for i in range(1, 6)]
    ledger.fork_session("main_s", runs[3].id, "f_1")
    own = [_turn(ledger, "f_1", i) for i in range(20, 23)]
    ledger.fork_session("f_1", own[0].id, "f_2")  # f1's own run
    ledger.fork_session("f_1", runs[1].id, "f_3")  # a run f1 inherits
    names = _copy(ledger, "f_1", own[0], "c_2")
    assert _seen(ledger, "f_2", {}) == _seen(ledger, "c_2", names)
    names = _copy(ledger, "f_1", runs[1], "c_3")
    assert _seen(ledger, "f_3", {}) == _seen(ledger, "c_3", names)

    with pytest.raises(AlreadyExists):
        ledger.fork_session("main_s", runs[0].id, "f_1")
    with pytest.raises(NotFound):
        ledger.fork_session("no_such", runs[0].id, "f_9")
    with pytest.raises(UsageError, match="not a run of session"):
        ledger.fork_session("main_s", own[0].id, "f_9")  # f1's run is not s's
    with pytest.raises(UsageError, match="not a run of session"):
        ledger.fork_session("f_3", runs[3].id, "f_9")  # after f3's fork point
    live = ledger.claim_run(ledger.create_run("main_s", "rev").id)
    with pytest.raises(UsageError, match="has ended"):
        ledger.fork_session("main_s", live.run, "f_9")
    assert ledger.session("f_9") is None


def test_erasing_in_the_session_erases_what_its_forks_inherit(ledger: Ledger) -> None:
    runs = [_turn(ledger, "main_s", i) for i in range(1, 6)]
    ledger.fork_session("main_s", runs[4].id, "f_0")
    for i in (30, 31, 32, 33):  # turn 31 writes a checkpoint over inherited rows
        _turn(ledger, "f_0", i)
    [checkpoint] = [
        r for r in ledger.iter_rows("f_0") if r.kind is RowKind.COMPACTION and r.seq > 20
    ]
    inherited = ledger.fork_of("f_0")
    assert inherited is not None
    assert "repo:closed/b" in checkpoint.sources  # it covers the closed rows it inherits

    plan = ledger.plan_erasure(Selector(SelectorKind.SOURCE, "repo:closed/b"))
    assert checkpoint.seq in plan.rows["f_0"]
    ledger.erase(plan.selector, actor="user:op")
    for session in ("main_s", "f_0"):
        left = list(ledger.iter_rows(session))
        assert all("repo:closed/b" not in r.sources for r in left)
        assert all("answer 3.0" not in json.dumps(r.body) for r in left)  # turn 3's, closed
        hits = ledger.search(session, ["answer"], limit=100)
        assert hits
        assert all("repo:closed/b" not in h.row.sources for h in hits)
    assert next(r.seq for r in ledger.iter_rows("f_0")) == 1  # the rest is still inherited

    # The session whole: the fork keeps its own rows; what it inherited is gone.
    own = [r.seq for r in ledger.iter_rows("f_0") if r.seq > inherited[1]]
    done, _ = ledger.erase(Selector(SelectorKind.SESSION, "main_s"), actor="user:op")
    assert [r.seq for r in ledger.iter_rows("f_0")] == own
    assert ledger.fork_of("f_0") is None
    assert ledger.latest_compaction("f_0") is None
    assert all(r.seq > inherited[1] for r in ledger.iter_rows("f_0"))
    assert done.counts["sessions"] == 1
    # A new session of the same name is not the fork's parent.
    ledger.ensure_session("main_s")
    assert [r.seq for r in ledger.iter_rows("f_0")] == own
