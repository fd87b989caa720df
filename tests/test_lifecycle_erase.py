"""Erasure and retention in the ledger (docs/operations.md#erasure-and-retention), on every
backend: what a selector takes
(and what it leaves), the plan a dry run shows against what goes, receipts, a live run, and the
sessions retention finds idle."""

from __future__ import annotations

import datetime
import functools
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.views import granted_view
from tether.config import Config, CustodyConfig, HarnessConfig
from tether.errors import NotFound, RunNotActive, SessionBusy, SessionRefusing
from tether.followup import FollowupView
from tether.harness.custody.erasing import erase_stopping
from tether.ledger import Fence, Ledger, NewRow, RowKind, RunStatus
from tether.ledger.erasing import StopRequest
from tether.ledger.lifecycle import Selector, SelectorKind, apply_retention, erase_selected

AGENT = "rev"


def _msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}


def _turn(
    ledger: Ledger,
    session: str,
    request: str,
    answers: list[tuple[str, tuple[str, ...]]],
    request_sources: tuple[str, ...] = (),
) -> str:
    ledger.ensure_session(session)
    fence = ledger.claim_run(ledger.create_run(session, AGENT).id)
    asked = NewRow.message("user:ana", _msg("user", request), sources=request_sources)
    ledger.append(fence, [asked], request=True)
    ledger.append(
        fence,
        [
            NewRow.message(f"agent:{AGENT}", _msg("assistant", text), sources=src)
            for text, src in answers
        ],
    )
    ledger.end_run(fence, RunStatus.FINISHED, extra={"answer": answers[-1][0]})
    return fence.run


def _compaction(ledger: Ledger, session: str, covers_to: int) -> int:
    fence = ledger.claim_run(ledger.create_run(session, AGENT).id)
    ledger.append(fence, [NewRow.message("user:ana", _msg("user", "go on"))], request=True)
    [row] = ledger.append(
        fence,
        [
            NewRow(
                actor=f"agent:{AGENT}",
                kind=RowKind.COMPACTION,
                body={"summary": "so far", "covers_to": covers_to, "tokens_before": 1},
            )
        ],
    )
    ledger.end_run(fence, RunStatus.FINISHED)
    return row.seq


def _seqs(ledger: Ledger, session: str) -> list[int]:
    return [r.seq for r in ledger.iter_rows(session)]


def test_a_source_takes_its_rows_the_checkpoints_over_them_and_its_notes(
    ledger: Ledger, tmp_path: Path
) -> None:
    _turn(ledger, "s1", "first", [("plain", ()), ("from x", ("repo:x",))])  # seqs 1-3
    _turn(ledger, "s1", "second", [("plain again", ("repo:y",))])  # seqs 4-5
    covering = _compaction(ledger, "s1", covers_to=5)  # request 6, compaction 7
    assert covering == 7
    _turn(ledger, "s2", "other", [("not x", ("repo:xy", "x"))])
    ledger.add_note("s1", AGENT, "from x", sources=["repo:x"])
    ledger.add_note("s1", AGENT, "kept", sources=["repo:y"])

    selector = Selector(SelectorKind.SOURCE, "repo:x")
    plan = ledger.plan_erasure(selector)
    # The row with the source, and the checkpoint that covers it (which carries it too).
    assert plan.rows == {"s1": [3, 7]}
    assert plan.checkpoints == {"s1": [7]}
    assert plan.counts()["notes"] == 1
    assert plan.runs == []  # no request row carried it
    assert len(plan.scrubbed_runs) == 2  # the run of row 3 and that of the checkpoint

    receipt, done = ledger.erase(selector, actor="user:op")
    assert done == plan
    assert _seqs(ledger, "s1") == [1, 2, 4, 5, 6]
    assert len(_seqs(ledger, "s2")) == 2
    assert [n.text for n in ledger.all_notes("s1")] == ["kept"]
    assert ledger.latest_compaction("s1") is None
    scrubbed = ledger.get_run(plan.scrubbed_runs[0])
    assert "answer" not in scrubbed.extra
    assert scrubbed.extra["erased"] is True
    assert ledger.erasures()[0] == receipt
    assert receipt.counts["rows"] == 2
    # Nothing left to erase: a second erasure plans nothing, and still leaves a receipt.
    assert ledger.plan_erasure(selector).counts()["rows"] == 0

    view = granted_view(ledger, 100_000, agent=AGENT)
    assert isinstance(view, FollowupView), view
    assert view.checkpoint is None
    assert all("from x" not in str(m.message) for m in view.messages)


def test_an_erased_request_takes_its_run(ledger: Ledger) -> None:
    _turn(ledger, "s1", "first", [("a", ())])
    secret = _turn(ledger, "s1", "secret ask", [("answer", ())], request_sources=("doc:p",))
    plan = ledger.plan_erasure(Selector(SelectorKind.SOURCE, "doc:p"))
    assert plan.rows == {"s1": [3, 4]}
    assert plan.runs == [secret]
    ledger.erase(plan.selector, actor="user:op")
    assert ledger.run(secret) is None
    assert ledger.last_ended_run("s1", AGENT) is not None  # the earlier run is the previous one


def test_a_session_goes_whole_with_its_queued_requests(ledger: Ledger, tmp_path: Path) -> None:
    run_id = _turn(ledger, "s1", "first", [("a", ())])
    queued, _ = ledger.enqueue_run("s1", AGENT, text="later", actor="user:ana")
    _turn(ledger, "s2", "other", [("b", ())])
    ledger.add_note("s1", AGENT, "n")
    (tmp_path / "runs" / run_id).mkdir(parents=True)
    (tmp_path / "runs" / run_id / "session.jsonl").write_text("x")

    dry = erase_selected(
        ledger,
        Selector(SelectorKind.SESSION, "s1"),
        actor="user:op",
        runs_dir=tmp_path / "runs",
        dry_run=True,
    )
    assert dry.receipt is None
    assert dry.plan.queued == [queued.id]
    assert dry.run_dirs == [run_id]
    assert ledger.session("s1") is not None

    done = erase_selected(
        ledger, Selector(SelectorKind.SESSION, "s1"), actor="user:op", runs_dir=tmp_path / "runs"
    )
    assert done.plan == dry.plan
    assert done.run_dirs == [run_id]
    assert not (tmp_path / "runs" / run_id).exists()
    assert ledger.session("s1") is None
    assert ledger.run(queued.id) is None
    assert ledger.all_notes("s1") == []
    assert len(_seqs(ledger, "s2")) == 2
    assert done.receipt is not None
    assert done.receipt.counts == {**dry.plan.counts()}
    with pytest.raises(NotFound):
        ledger.plan_erasure(Selector(SelectorKind.SESSION, "s1"))


def test_a_live_run_refuses_the_erasure_and_nothing_goes(ledger: Ledger) -> None:
    _turn(ledger, "s1", "first", [("a", ("repo:x",))])
    live = ledger.claim_run(ledger.create_run("s1", AGENT).id)
    with pytest.raises(SessionBusy) as caught:
        ledger.erase(Selector(SelectorKind.SOURCE, "repo:x"), actor="user:op")
    assert caught.value.live == live.run
    assert _seqs(ledger, "s1") == [1, 2]
    assert ledger.erasures() == []


def test_retention_erases_idle_sessions_only(ledger: Ledger, tmp_path: Path) -> None:
    old = "2026-01-01T00:00:00.000000Z"
    ledger.create_session("idle", created=old)
    ledger.create_session("busy", created=old)
    ledger.enqueue_run("busy", AGENT, text="waiting", actor="user:ana")
    ledger.create_session("noted", created=old)
    ledger.add_note("noted", AGENT, "recent")
    _turn(ledger, "fresh", "now", [("a", ())])
    now = datetime.datetime.now(datetime.UTC)

    dry = apply_retention(
        ledger, 30, actor="tether:retention", runs_dir=tmp_path, now=now, dry_run=True
    )
    assert [d.plan.sessions for d in dry] == [["idle"]]
    assert ledger.session("idle") is not None
    done = apply_retention(ledger, 30, actor="tether:retention", runs_dir=tmp_path, now=now)
    assert [d.plan for d in done] == [d.plan for d in dry]
    assert ledger.session("idle") is None
    assert {s.id for s in ledger.sessions()} == {"busy", "noted", "fresh"}
    assert ledger.erasures()[0].selector == {"session": "idle"}


def _gaps(view: FollowupView) -> list[tuple[int, int, str]]:
    return [(g.first, g.last, g.why.value) for g in view.gaps]


def _next_view(ledger: Ledger, session: str, budget: int) -> FollowupView:
    view = granted_view(ledger, budget, session=session, agent=AGENT)
    assert isinstance(view, FollowupView), view
    return view


def test_the_rows_an_erasure_takes_are_named_as_an_erased_gap(ledger: Ledger) -> None:
    _turn(ledger, "s1", "first", [("plain", ()), ("from x", ("repo:x",))])  # seqs 1-3
    _turn(ledger, "s1", "second", [("plain again", ())])  # seqs 4-5
    _compaction(ledger, "s1", covers_to=5)  # request 6, compaction 7
    _turn(ledger, "s1", "third", [("last", ())])  # seqs 8-9
    before = _next_view(ledger, "s1", 100_000)
    assert before.checkpoint is not None
    assert before.checkpoint.seq == 7
    assert _gaps(before) == []

    ledger.erase(Selector(SelectorKind.SOURCE, "repo:x"), actor="user:op")
    view = _next_view(ledger, "s1", 100_000)
    # No checkpoint (it covered the erased row): the view falls back to the rows and names
    # the seqs that are gone as erased, not as rows that did not fit.
    assert view.checkpoint is None
    assert _gaps(view) == [(3, 3, "erased"), (7, 7, "erased")]
    notices = [m for m in view.messages if m.synthetic and "row 3 " in str(m.message)]
    assert len(notices) == 1
    assert "erased" in str(notices[0].message["content"])
    assert "recall(" not in str(notices[0].message["content"])  # nothing there to recall
    assert {m.origin for m in view.messages if m.origin} == {1, 2, 4, 5, 6, 8, 9}


def test_erased_seqs_and_rows_that_did_not_fit_are_told_apart(ledger: Ledger) -> None:
    for i in range(6):
        _turn(ledger, "s1", f"ask {i} " + "x" * 300, [(f"answer {i} " + "y" * 300, ())])
    # The newest turn's request carries a source: erasing it takes the whole run (seqs 13-14),
    # so the session's last seqs no longer exist.
    secret = _turn(ledger, "s1", "secret", [("ok", ())], request_sources=("doc:p",))
    runs = ledger.runs("s1")
    ledger.erase(Selector(SelectorKind.SOURCE, "doc:p"), actor="user:op")
    assert ledger.run(secret) is None
    assert runs[-2].id == ledger.last_ended_run("s1", AGENT).id  # type: ignore[union-attr]

    view = _next_view(ledger, "s1", 100_000)
    assert _gaps(view) == [(13, 14, "erased")]
    # A budget that leaves the oldest rows out: those are a budget gap, the erased seqs stay
    # erased.
    small = _next_view(ledger, "s1", 2_500)
    gaps = _gaps(small)
    assert gaps[-1] == (13, 14, "erased")
    assert gaps[0][2] == "budget"
    assert gaps[0][0] == 1
    assert all(why != "erased" for lo, hi, why in gaps[:-1])


# -- a live run is stopped first (issue 31) ------------------------------------------------------


def _config(tmp_path: Path, *, lease_s: float = 30.0) -> Config:
    return Config(
        harness=HarnessConfig(
            runs_dir=tmp_path / "runs", workspaces_dir=tmp_path / "workspaces", stop_grace_s=0.2
        ),
        custody=CustodyConfig(lease_s=lease_s),
    )


class _Owner:
    """A run's owner in another thread, as a harness elsewhere would be: it heartbeats its lease
    and reads the stop asked of it through the ledger (as ``helpers.watch_stop_requests``
    does), ending the run ``interrupted`` with the stop's words when it obeys it."""

    def __init__(self, ledger: Ledger, fence: Fence, *, obeys: set[bool], lease_s: float) -> None:
        self.ledger, self.fence, self.obeys, self.lease_s = ledger, fence, obeys, lease_s
        self.seen: list[StopRequest] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Owner:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                self.ledger.heartbeat(self.fence, lease_s=self.lease_s)
                asked = self.ledger.stop_request(self.fence)
            except (RunNotActive, NotFound):
                return
            if asked is not None and (not self.seen or self.seen[-1] != asked):
                self.seen.append(asked)
                if asked.hard in self.obeys:
                    reason = "hard_stop" if asked.hard else "soft_stop"
                    self.ledger.end_run(
                        self.fence,
                        RunStatus.INTERRUPTED,
                        extra={"stop_reason": reason, "error": asked.detail},
                    )
                    return
            self.done.wait(0.05)


def _live(ledger: Ledger, session: str) -> Fence:
    fence = ledger.claim_next(owner="elsewhere", lease_s=30, session=session, run_id=None)
    if fence is None:
        fence = ledger.claim_run(ledger.create_run(session, AGENT).id)
    return fence


def _erase(ledger: Ledger, cfg: Config, selector: Selector, **kw: Any) -> Any:
    said: list[str] = []
    done = anyio.run(
        functools.partial(
            erase_stopping, ledger, cfg, selector, actor="user:op", say=said.append, **kw
        )
    )
    return done, said


@pytest.mark.parametrize("obeys", [{False, True}, {True}], ids=["soft", "hard"])
def test_a_live_run_is_stopped_then_its_session_erased(
    ledger: Ledger, tmp_path: Path, obeys: set[bool]
) -> None:
    _turn(ledger, "s1", "first", [("a", ())])
    fence = _live(ledger, "s1")
    cfg = _config(tmp_path)
    selector = Selector(SelectorKind.SESSION, "s1")

    # A dry run stops nothing: it names the run it would stop.
    dry, _ = _erase(ledger, cfg, selector, dry_run=True)
    assert [r["run"] for r in dry.stopped] == [fence.run]
    assert ledger.get_run(fence.run).status is RunStatus.RUNNING
    assert ledger.stop_request(fence) is None

    with _Owner(ledger, fence, obeys=obeys, lease_s=30) as owner:
        done, said = _erase(ledger, cfg, selector, stop_grace_s=0.5)
    how = "soft" if False in obeys else "hard"
    [stopped] = done.stopped
    assert stopped == {
        "run": fence.run,
        "session": "s1",
        "how": how,
        "status": "interrupted",
        "stop_reason": f"{how}_stop",
    }
    # The owner saw the request through the ledger, with its words.
    assert [a.hard for a in owner.seen] == ([False] if how == "soft" else [False, True])
    assert owner.seen[0].detail == "the session is being erased (by user:op)"
    assert said[0] == f"stopping run {fence.run} on session s1 (soft)…"
    assert ledger.session("s1") is None
    assert ledger.run(fence.run) is None
    assert done.receipt is not None
    assert done.receipt.counts["runs"] == 2


def test_a_source_erasure_stops_the_run_and_leaves_the_session_taking_prompts(
    ledger: Ledger, tmp_path: Path
) -> None:
    _turn(ledger, "s1", "first", [("a", ("repo:x",))])
    fence = _live(ledger, "s1")
    queued, _ = ledger.enqueue_run("s1", AGENT, text="later", actor="user:ana")
    with _Owner(ledger, fence, obeys={False}, lease_s=30):
        done, _ = _erase(ledger, _config(tmp_path), Selector(SelectorKind.SOURCE, "repo:x"))
    assert [(r["run"], r["how"]) for r in done.stopped] == [(fence.run, "soft")]
    ended = ledger.get_run(fence.run)
    assert (ended.status, ended.extra["stop_reason"]) == (RunStatus.INTERRUPTED, "soft_stop")
    assert ended.extra["error"] == "the session is being erased (by user:op)"
    assert _seqs(ledger, "s1") == [1]  # the answer carrying repo:x went
    # The marks went with the erasure: the session takes prompts, its queue runs on.
    session = ledger.get_session("s1")
    assert session.refusing is None
    assert session.extra == {}
    assert ledger.claim_next(owner="w", lease_s=30, session="s1") == Fence(queued.id, "s1", 1)


def test_a_session_being_erased_takes_no_prompt_and_no_claim(ledger: Ledger) -> None:
    _turn(ledger, "s1", "first", [("a", ())])
    _queued, _ = ledger.enqueue_run("s1", AGENT, text="later", actor="user:ana")
    assert ledger.begin_erasure(["s1", "gone"], actor="user:op") == ["s1"]
    refusing = ledger.get_session("s1").refusing
    assert refusing is not None
    assert refusing.startswith("erasing: user:op is erasing it")
    with pytest.raises(SessionRefusing):
        ledger.enqueue_run("s1", AGENT, text="more", actor="user:ana")
    assert ledger.claim_next(owner="w", lease_s=30, session="s1") is None
    assert ledger.claim_next(owner="w", lease_s=30) is None
    ledger.end_erasure(["s1"])
    assert ledger.get_session("s1").refusing is None
    assert ledger.claim_next(owner="w", lease_s=30, session="s1") is not None
    # A refusal that was there before the erasure stays after it; `session clear` takes an
    # erasure's marks away with the refusal (an erasure that died half-way).
    ledger.create_session("s2")
    ledger.set_refusing("s2", "unconfirmed_ending: checked by nobody")
    ledger.begin_erasure(["s2"], actor="user:op")
    ledger.end_erasure(["s2"])
    assert ledger.get_session("s2").refusing == "unconfirmed_ending: checked by nobody"
    ledger.begin_erasure(["s2"], actor="user:op")
    ledger.set_refusing("s2", None)
    assert ledger.get_session("s2").extra == {}
    assert ledger.claim_next(owner="w", lease_s=30, session="s2") is None  # nothing queued


def test_a_run_whose_owner_is_gone_is_ended_as_recovery_would_then_erased(
    ledger: Ledger, tmp_path: Path
) -> None:
    _turn(ledger, "s1", "first", [("a", ())])
    # Claimed with a lease that lapses at once, and no owner heartbeating it (no placement
    # either: recovery ends it unconfirmed).
    fence = ledger.claim_next(owner="dead", lease_s=0.01, session="s1")
    if fence is None:
        fence = ledger.claim_run(ledger.create_run("s1", AGENT).id)
    done, said = _erase(
        ledger, _config(tmp_path, lease_s=1), Selector(SelectorKind.SESSION, "s1"), stop_grace_s=0.3
    )
    [stopped] = done.stopped
    assert (stopped["how"], stopped["status"], stopped["stop_reason"]) == (
        "recovered",
        "interrupted",
        "unconfirmed_ending",
    )
    assert any("owner was gone" in line for line in said)
    assert ledger.session("s1") is None


def test_a_run_that_does_not_stop_fails_the_erasure_and_nothing_goes(
    ledger: Ledger, tmp_path: Path
) -> None:
    _turn(ledger, "s1", "first", [("a", ())])
    fence = _live(ledger, "s1")
    # A lease long enough that a loaded machine's pause between the owner's heartbeats never
    # lets it lapse (a lapsed lease is recovered, and the erasure then goes ahead, rightly).
    cfg = _config(tmp_path, lease_s=3)
    with _Owner(ledger, fence, obeys=set(), lease_s=3), pytest.raises(SessionBusy) as caught:
        _erase(ledger, cfg, Selector(SelectorKind.SESSION, "s1"), stop_grace_s=0.2)
    message = str(caught.value)
    assert f"run {fence.run} on session s1 did not end" in message
    assert "nothing was erased" in message
    assert "`tether recover`" in message
    assert _seqs(ledger, "s1") == [1, 2]
    assert ledger.erasures() == []
    # The erasure's marks went: the session takes prompts again.
    session = ledger.get_session("s1")
    assert session.refusing is None
    assert session.extra == {}


def test_one_row_takes_what_derives_from_it_and_nothing_else(
    ledger: Ledger, tmp_path: Path
) -> None:
    """A chat message taken back (a Matrix redaction): its row goes; a request's run goes with
    it; a checkpoint covering it goes; another row of the run leaves the run scrubbed."""
    first = _turn(ledger, "s1", "first", [("answer one", ())])  # seqs 1-2
    second = _turn(ledger, "s1", "second", [("answer two", ())])  # seqs 3-4
    third = _turn(ledger, "s1", "third", [("answer three", ())])  # seqs 5-6
    done = erase_selected(ledger, Selector.row("s1", 3), actor="bridge:matrix", runs_dir=tmp_path)
    assert done.plan.rows == {"s1": [3, 4]}
    assert done.plan.runs == [second]
    assert _seqs(ledger, "s1") == [1, 2, 5, 6]
    assert ledger.run(second) is None
    assert ledger.run(first) is not None
    assert [e.selector for e in ledger.erasures(limit=1)] == [{"row": "s1#3"}]
    # An answer row: it goes alone, its run stays with what it held scrubbed.
    checkpoint = _compaction(ledger, "s1", covers_to=6)  # seqs 7-8
    done = erase_selected(ledger, Selector.row("s1", 6), actor="bridge:matrix", runs_dir=tmp_path)
    assert done.plan.rows == {"s1": [6, checkpoint]}
    assert done.plan.runs == []
    assert third in done.plan.scrubbed_runs
    assert _seqs(ledger, "s1") == [1, 2, 5, 7]
    with pytest.raises(NotFound, match="no row 99"):
        erase_selected(ledger, Selector.row("s1", 99), actor="bridge:matrix", runs_dir=tmp_path)
    with pytest.raises(ValueError, match="SESSION#SEQ"):
        ledger.plan_erasure(Selector(SelectorKind.ROW, "s1"))
