"""Generated sessions, checked against every follow-up invariant (invariants 1–8, 18).

Sessions are made of runs of two agents with every ending status; requests that are complete,
partial, missing or never recorded; tool calls with and without results, parallel calls, rows
larger than the budget, media in requests and tool results, receipts, compactions anywhere (pi's
own mid-run and continuation checkpoints), notes, and sources that the requester may or may not
be granted (a withheld request has a stand-in in its place; a withheld checkpoint's range is a
withheld gap, docs/contracts.md#the-follow-up-view). Each view is checked with the tests' own byte
count, an oracle for
the previous request written from the design's words, and a scenario-side oracle of invariant 5
(:class:`Oracle`): from the generated rows alone it assembles and measures the ordinary window
(the newest exchanges after the coverage that fit what the reservations leave, opening at a user
message with text), decides from it whether the request is reused in place or read and placed
first, and assembles that view too (the rows the suffix starts from, every gap, the bytes). The
view must be one of what it allows, exactly, and what it would take next must not fit. Only the
reads are taken from the run (where the last tail read began, whether the probe was read):
invariant 9 bounds what the view can weigh.
"""

from __future__ import annotations

import dataclasses
import json
import os
from fnmatch import fnmatchcase
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from followup_sessions import (
    RandomChooser,
    Sketch,
    assistant,
    calls_message,
    pi_like,
    size_of,
    tool_result,
    user,
)
from tether.config import FollowupConfig
from tether.followup import FollowupView, GapWhy, Refusal, RefusalReason, RequestMode, build_view
from tether.followup import core as followup_core
from tether.followup import messages as msgs
from tether.followup.core import MAX_SKIPS, PROBE_ROWS
from tether.ledger import Note, RowKind, Run, RunStatus, open_ledger

AGENT = "rev"
ACTOR = "user:req"
SOURCES = ["repo:a/x", "repo:b/y", "doc:hb"]
PATTERNS = ["repo:a/*", "repo:*", "doc:hb", "doc:*"]
ENDED = {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED}
MEDIA = FollowupConfig(media_max_bytes=400, tool_media_max_bytes=250, media_max_total_bytes=700)
# What tether may add around the protected context (wrappers, notices): a generous bound used
# only to pick sessions whose rows after the coverage all fit with room to spare.
OVERHEAD = 4000


class Scenario(Sketch):
    """A generated session (not a dataclass, so failures print it compactly)."""

    def __init__(self) -> None:
        super().__init__("s")
        self.grants: list[str] = []
        self.budget = 10_000
        self.refusing = False

    def __repr__(self) -> str:
        def short(value: Any) -> Any:
            if isinstance(value, str):
                return value if len(value) <= 24 else f"{value[:12]}…[{len(value)}]"
            if isinstance(value, dict):
                return {k: short(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [short(v) for v in value]
            return value

        rows = "\n  ".join(
            f"{r['seq']} {r['run']} {r['actor']} {r['kind'].value} {r['sources']} "
            f"{json.dumps(short(r['body']), ensure_ascii=False)}"
            for r in self.rows
        )
        runs = ", ".join(f"{r.id}:{r.agent}:{r.status.value}:{r.request_seq}" for r in self.runs)
        notes = ", ".join(f"{n.agent}:{len(n.text)}" for n in self.notes)
        return (
            f"Scenario(budget={self.budget}, grants={self.grants}, refusing={self.refusing},\n"
            f" runs=[{runs}], notes=[{notes}],\n  {rows})"
        )


def admitted(sources: Any, grants: list[str]) -> bool:
    return all(any(fnmatchcase(s, p) for p in grants) for s in sources)


@st.composite
def odd_scenarios(draw: st.DrawFn) -> Scenario:
    """Sessions full of edge cases: every request defect, compactions anywhere, orphans."""
    sc = Scenario()
    sc.budget = draw(st.sampled_from([2500, 6000, 15_000, 60_000]))
    sc.grants = draw(st.lists(st.sampled_from(PATTERNS), max_size=3, unique=True))
    sc.refusing = draw(st.integers(0, 19)) == 0
    sizes = st.sampled_from([0, 20, 200, 1500, 8000, 70_000])
    sources = st.lists(st.sampled_from(SOURCES), max_size=2, unique=True).map(tuple)
    maybe_sources = st.one_of(st.just(()), st.just(()), sources)
    # A request is as often one no grant admits (its view carries a stand-in,
    # docs/contracts.md#the-follow-up-view).
    request_sources = st.one_of(maybe_sources, st.just(("vault:k",)))
    image = st.one_of(st.none(), st.none(), st.sampled_from([100, 300, 600]).map(lambda n: "Q" * n))
    ts = 1_764_410_400_000
    calls = 0
    for i in range(draw(st.integers(0, 5))):
        rid = f"r{i}"
        agent = draw(st.sampled_from([AGENT, AGENT, "other"]))
        status = draw(st.sampled_from(list(RunStatus)))
        how = draw(st.sampled_from(["ok"] * 6 + ["unrecorded", "nothing", "partial", "missing"]))
        request_seq: int | None = None
        if how == "nothing":
            sc.runs.append(Run(rid, "s", agent, status))
            continue
        if draw(st.booleans()):
            sc.add(
                rid, "system", RowKind.MESSAGE, {"role": "system", "content": "", "timestamp": ts}
            )
        ts += 1000
        text = "REQTEXT " + "r" * draw(sizes)  # never in what tether writes
        if how == "partial":
            body = draw(
                st.sampled_from(
                    [
                        {
                            "role": "assistant",
                            "content": [{"type": "text", "text": "not a request"}],
                        },
                        {"role": "user", "content": "   ", "timestamp": ts},
                    ]
                )
            )
        else:
            body = user(text, ts=ts, image=draw(image))
        seq = sc.add(
            rid,
            draw(st.sampled_from(["user:ana", "user:bob"])),
            RowKind.MESSAGE,
            body,
            draw(request_sources),
        )
        if how in ("ok", "partial"):
            request_seq = seq
        elif how == "missing":
            request_seq = draw(st.sampled_from([seq + 10_000, 1]))
        for _ in range(draw(st.integers(0, 6))):
            ts += 1000
            step = draw(st.sampled_from(["say", "calls", "calls", "receipt", "compaction", "user"]))
            if step == "say":
                sc.add(
                    rid,
                    f"agent:{agent}",
                    RowKind.MESSAGE,
                    assistant("a" * draw(sizes), ts=ts),
                    draw(maybe_sources),
                )
            elif step == "user":
                sc.add(rid, "user:ana", RowKind.MESSAGE, user("more " + "u" * draw(sizes), ts=ts))
            elif step == "calls":
                batch = []
                for _ in range(draw(st.integers(1, 3))):
                    calls += 1
                    batch.append((f"c{calls}", "read", {"path": f"f{calls}"}))
                sc.add(
                    rid,
                    f"agent:{agent}",
                    RowKind.MESSAGE,
                    calls_message(batch, ts=ts),
                    draw(maybe_sources),
                )
                for cid, name, _args in batch:
                    if draw(st.integers(0, 4)) == 0:
                        continue  # no result recorded
                    sc.add(
                        rid,
                        f"tool:{name}",
                        RowKind.MESSAGE,
                        tool_result(cid, name, "t" * draw(sizes), ts=ts, image=draw(image)),
                        draw(maybe_sources),
                    )
            elif step == "receipt":
                reason = draw(st.sampled_from(["truncated", "empty", "cancelled"]))
                sc.add(
                    rid,
                    f"agent:{agent}",
                    RowKind.RECEIPT,
                    {"kind": "continuation_checkpoint_refused", "run": rid, "reason": reason},
                )
            else:
                covers = draw(st.integers(0, sc.seq() - 1))
                sc.add(
                    rid,
                    f"agent:{agent}",
                    RowKind.COMPACTION,
                    {"summary": "sum " + "s" * draw(sizes), "covers_to": covers},
                    draw(maybe_sources),
                )
        if status in ENDED and agent == AGENT and draw(st.integers(0, 2)) == 0:
            sc.add(
                rid,
                f"agent:{agent}",
                RowKind.COMPACTION,
                {
                    "summary": "checkpoint " + "k" * draw(sizes),
                    "covers_to": sc.seq() - 1,
                    "continuation": {"version": 1, "run": rid},
                },
            )
        sc.runs.append(Run(rid, "s", agent, status, request_seq=request_seq))
    for i in range(draw(st.integers(0, 3))):
        sc.notes.append(
            Note(
                "s",
                draw(st.sampled_from([AGENT, "other"])),
                f"note {i} " + "n" * draw(sizes),
                f"2026-11-29T10:0{i}:00Z",
            )
        )
    sc.seal()
    return sc


@st.composite
def pi_scenarios(draw: st.DrawFn) -> Scenario:
    """Sessions like pi's real ones (long tool-heavy turns, few user messages, pi's own
    compactions mid-run, prompt snapshots), written by the generator the benchmark uses."""
    sc = Scenario()
    sc.budget = draw(st.sampled_from([6000, 15_000, 60_000]))
    sc.grants = draw(st.sampled_from([["repo:*", "doc:*"], ["repo:*", "doc:*"], ["repo:a/*"], []]))
    sources = (("repo:a/x",), ("repo:a/x",), ("doc:hb",))
    # The bulk of a session's choices come from a seeded generator (hundreds of draws each
    # would make hypothesis spend its time generating); the seed, the budget, the grants and
    # the number of runs shrink.
    pi_like(
        sc,
        RandomChooser(draw(st.integers(0, 2**32))),
        budget=sc.budget,
        agents=[AGENT, "other"],
        runs=draw(st.integers(1, 6)),
        sources=sources,
    )
    for i in range(draw(st.integers(0, 2))):
        sc.notes.append(
            Note("s", AGENT, f"note {i} " + "n" * (sc.budget // 100), f"2026-11-29T10:0{i}:00Z")
        )
    sc.seal()
    return sc


def scenarios() -> st.SearchStrategy[Scenario]:
    return st.one_of(odd_scenarios(), pi_scenarios())


def expected_request(sc: Scenario) -> tuple[RefusalReason | None, int | None]:
    """The previous request by the design's words: the exact request row of the newest ended run
    of the agent that has a session record; or why the view is refused. One the requester may
    not read is no refusal: the view carries a stand-in in its place (see :func:`withheld`)."""
    by_seq = {r["seq"]: r for r in sc.rows}
    has_rows = {r["run"] for r in sc.rows}
    for run in reversed([r for r in sc.runs if r.agent == AGENT and r.status in ENDED]):
        if run.request_seq is None:
            if run.id in has_rows:
                return RefusalReason.INCOMPLETE_REQUEST, None
            continue
        row = by_seq.get(run.request_seq)
        if row is None or row["run"] != run.id:
            return RefusalReason.SOURCE_UNAVAILABLE, None
        body = row["body"]
        content = body.get("content")
        texts = (
            [content]
            if isinstance(content, str)
            else [b.get("text", "") for b in content or [] if b.get("type") == "text"]
        )
        if body.get("role") != "user" or not any(t.strip() for t in texts):
            return RefusalReason.INCOMPLETE_REQUEST, None
        return None, run.request_seq
    return None, None


def withheld(sc: Scenario, request_seq: int | None) -> bool:
    """Whether the previous request is one the requester may not read."""
    return request_seq is not None and not admitted(sc.rows[request_seq - 1]["sources"], sc.grants)


def stand_in_size(sc: Scenario, request_seq: int, timestamp: int) -> int:
    """The size of the stand-in tether writes in a withheld request's place."""
    row = sc.rows[request_seq - 1]
    return size_of(
        msgs.request_stand_in(request_seq, row["run"], row["actor"], timestamp=timestamp)
    )


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def check(
    sc: Scenario, view: FollowupView | Refusal, read_from: int = 1, probed: bool = False
) -> None:
    by_seq = {r["seq"]: r for r in sc.rows}
    last = len(sc.rows)
    refusal, request_seq = expected_request(sc)
    # A refused view carries nothing: every other invariant is about the messages of a view
    # that is not refused (3: "whenever such a run exists and the view is not refused").
    # Denied first: a requester not admitted to the session's opening row may not see it at all.
    if sc.rows and not admitted(sc.rows[0]["sources"], sc.grants):
        assert isinstance(view, Refusal)
        assert view.reason is RefusalReason.ACCESS_DENIED, view
        return
    if sc.refusing:
        assert isinstance(view, Refusal)
        assert view.reason is RefusalReason.SESSION_REFUSING
        return
    if refusal is not None:
        assert isinstance(view, Refusal)
        assert view.reason is refusal, view.detail
        return
    comps = [r for r in sc.rows if r["kind"] is RowKind.COMPACTION]
    comp = comps[-1] if comps else None
    comp_ok = comp is not None and admitted(comp["sources"], sc.grants)
    # The notes the bounded read returns: the newest that fit the count and byte caps.
    notes: list[Note] = []
    total = 0
    for note in reversed([n for n in sc.notes if n.agent == AGENT]):
        size = len(note.text.encode())
        if len(notes) >= MEDIA.notes_max_count or total + size > MEDIA.notes_max_bytes:
            break
        total += size
        notes.insert(0, note)
    hidden = withheld(sc, request_seq)
    if hidden:
        event("previous request withheld")
    raw = (
        (size_of(by_seq[request_seq]["body"]) if request_seq and not hidden else 0)
        + (len(comp["body"]["summary"].encode()) if comp_ok and comp else 0)
        + sum(len(n.text.encode()) for n in notes)
    )
    covers = 0
    if comp is not None:
        covers = min(comp["body"]["covers_to"], comp["seq"] - 1)
    oracle = Oracle(sc, request_seq, comp, comp_ok, covers, notes, read_from, probed)
    # 4. Refused exactly when the protected context, with its wrappers and the notices naming
    # everything else, does not fit; a refused view carries nothing else to check.
    minimal = oracle.assemble([], request_seq is not None).bytes
    if isinstance(view, Refusal):
        assert view.reason is RefusalReason.PROTECTED_CONTEXT_OVER_BUDGET, view
        assert minimal > sc.budget, (minimal, view.detail)
        return
    assert raw <= sc.budget, "protected context over the budget must refuse"
    assert minimal <= sc.budget, minimal

    # 1. bytes ≤ budget, with our own count; media never count.
    assert view.bytes == sum(size_of(m.message) for m in view.messages)
    assert view.bytes <= sc.budget

    # 2. The newest compaction is read whatever the tail holds (when admitted).
    if comp_ok:
        assert comp is not None
        assert view.checkpoint is not None
        assert view.checkpoint.seq == comp["seq"]
        quoted = text_of(view.messages[0].message)
        assert "\n".join("> " + x for x in comp["body"]["summary"].split("\n")) in quoted
        assert view.messages[0].synthetic
        assert view.messages[0].role == "custom"
    else:
        assert view.checkpoint is None

    # 3. The exact previous request, byte-identical, with its original actor.
    origins = {m.origin: m for m in view.messages if m.origin is not None}
    assert len(origins) == len([m for m in view.messages if m.origin is not None])
    # Withheld, a stand-in stands in its place: a synthetic user message naming the row, its run
    # and actor, never its text (docs/contracts.md#the-follow-up-view). The oracle counts it as the
    # request's seq.
    carried = set(origins)
    if request_seq is None:
        assert view.previous_request is None
    elif hidden:
        assert view.previous_request is not None
        assert view.previous_request.seq == request_seq
        assert view.previous_request.withheld
        assert view.previous_request.to_json()["withheld"] is True
        row = by_seq[request_seq]
        assert view.previous_request.actor == row["actor"]
        assert request_seq not in origins
        named_row = f"ledger row {request_seq}, run {row['run']}, by {row['actor']})"
        [stand_in] = [m for m in view.messages if named_row in text_of(m.message)]
        assert stand_in.synthetic
        assert stand_in.role == "user"
        assert stand_in.origin is None
        assert stand_in.sources == ()
        assert "withheld" in text_of(stand_in.message)
        assert text_of(row["body"]) not in text_of(stand_in.message)
        carried.add(request_seq)
    else:
        assert view.previous_request is not None
        assert view.previous_request.seq == request_seq
        assert not view.previous_request.withheld
        assert "withheld" not in view.previous_request.to_json()
        row = by_seq[request_seq]
        m = origins[request_seq]
        assert m.actor == row["actor"] == view.previous_request.actor
        if not m.modified:
            assert json.dumps(m.message, sort_keys=True) == json.dumps(row["body"], sort_keys=True)
        else:
            assert text_of(m.message).startswith(text_of(row["body"]))

    # Notes and the summary: quoted, never a system prompt.
    for note in notes:
        assert any(
            "\n".join("> " + x for x in note.text.split("\n")) in text_of(m.message)
            for m in view.messages
            if m.synthetic
        )
    assert not any(m.role == "system" for m in view.messages)

    # 5 and 18. Carried rows: the oracle's view, computed from the scenario (see Oracle).
    allowed = oracle.expect()
    gaps = [(g.first, g.last, g.why) for g in view.gaps]
    matching = [(how, e) for how, e in allowed if (e.carried, e.gaps) == (carried, gaps)]
    if not matching and allowed[0][0] != "window":
        # Invariant 5 leaves the units a window passes over to the core's estimates: a view
        # that is such a window is accepted when each unit it passed over does not fit it.
        passing = oracle.passing_as_viewed(carried, gaps)
        if passing is not None:
            allowed.append(("window passing over units (as viewed)", passing))
            if (passing.carried, passing.gaps) == (carried, gaps):
                matching = [allowed[-1]]
    assert matching, (allowed, sorted(origins), view.gaps)
    # Views that carry the same rows and name the same gaps show every other row the same way
    # (a receipt as its notice), whichever way they were made: they cost the same bytes.
    assert len({e.bytes for _, e in matching}) == 1, matching
    how, expected = matching[0]
    event(f"oracle: {how}" + (f" (of {len(allowed)} allowed)" if len(allowed) > 1 else ""))
    assert view.bytes == expected.bytes, (expected, view.bytes)
    # 5. The budget is used: what the view would take next does not fit the space left.
    piece = oracle.next_piece(how, expected)
    if piece:
        grown = oracle.assemble([*piece, *expected.units], how == "request placed first")
        assert grown.bytes > sc.budget, (grown, sc.budget - view.bytes)
        event(f"budget used: next {'exchange' if oracle.opens(piece[0]) else 'unit'} too large")
    # 9. Bounded reads: when the units read after a request placed first ran out (fewer than
    # two left) with a twentieth of the budget still free, the tail was read again at its bound
    # (twice the budget in stored bytes), so the row before the read does not fit that bound.
    free = sc.budget - view.bytes
    if how in ("request placed first", "no opening") and free >= sc.budget // 20:
        floor = max(covers, request_seq or 0)
        if expected.left < 2 and read_from - 1 > floor:
            stored = sum(size_of(r["body"]) for r in sc.rows[read_from - 2 :])
            assert stored > 2 * sc.budget, (read_from, stored, free)
            event("read again at its bound")
    if request_seq is not None:
        assert view.previous_request is not None
        # 7. Reused only as contiguous stored rows: nothing omitted from the request on. A
        # request placed first that every row after it follows is that too (invariant
        # 7: rows are reused when they are contiguous with the previous request).
        reused = (
            covers < request_seq
            and not hidden  # a stand-in is not the stored row
            and not expected.modified
            and all(last < request_seq for _, last, _ in expected.gaps)
        )
        assert view.previous_request.mode is (RequestMode.REUSED if reused else RequestMode.COPIED)
    for seq, m in origins.items():
        row = by_seq[seq]
        assert admitted(row["sources"], sc.grants)
        assert m.actor == row["actor"]
        assert not m.synthetic
        if not m.modified:
            assert m.message == row["body"]
    expected_sources = set().union(*(by_seq[s]["sources"] for s in origins)) if origins else set()
    if comp_ok and comp is not None:
        expected_sources |= set(comp["sources"])
    assert set(view.sources) == expected_sources

    # 6. Pairing: results follow their call; every call is answered exactly once.
    pending: dict[str, bool] | None = None
    for m in view.messages:
        if m.role == "toolResult":
            assert pending is not None
            cid = m.message["toolCallId"]
            assert pending.get(cid) is False
            pending[cid] = True
            if m.synthetic:
                said = text_of(m.message)
                assert m.message["isError"] is True
                assert "effects are unknown" in said
                assert "may or may not have taken effect" in said
                assert "before repeating it" in said
            continue
        if pending is not None:
            assert all(pending.values())
        blocks = m.message.get("content") if isinstance(m.message.get("content"), list) else []
        ids = [b["id"] for b in blocks if b.get("type") == "toolCall"]
        pending = dict.fromkeys(ids, False) if ids and m.role == "assistant" else None
    if pending is not None:
        assert all(pending.values())
    # A batch is never split from its results: a carried call's recorded, admitted result that
    # directly follows it is carried too, not replaced.
    for seq, m in origins.items():
        if m.role != "assistant" or seq == request_seq:
            continue
        nxt = seq + 1
        while nxt <= last and by_seq[nxt]["body"].get("role") == "toolResult":
            if admitted(by_seq[nxt]["sources"], sc.grants):
                ids = {b.get("id") for b in m.message["content"] if b.get("type") == "toolCall"}
                if by_seq[nxt]["body"]["toolCallId"] in ids:
                    assert nxt in origins
            nxt += 1

    # 7. Reuse only when contiguous and unchanged; copies keep actor and origin.
    non_synthetic = [m for m in view.messages if not m.synthetic]
    if view.previous_request is not None and view.previous_request.mode is RequestMode.REUSED:
        assert not any(m.copied or m.modified for m in non_synthetic)
        assert all(g.last < view.previous_request.seq for g in view.gaps)
        assert covers <= view.previous_request.seq or not comp_ok
    else:
        assert all(m.copied for m in non_synthetic)

    # 8. Every seq is accounted for, and every gap is named exactly in a notice.
    in_gap: dict[int, GapWhy] = {}
    previous_end = 0
    for gap in view.gaps:
        assert previous_end < gap.first <= gap.last <= last
        previous_end = gap.last
        notice = [
            m
            for m in view.messages
            if m.synthetic and named(gap.first, gap.last) in text_of(m.message)
        ]
        assert len(notice) == 1
        assert f'recall({{"from":{gap.first},"to":{gap.last}}})' in text_of(notice[0].message)
        if gap.why is GapWhy.BUDGET:
            assert "did not fit" in text_of(notice[0].message)
        for s in range(gap.first, gap.last + 1):
            in_gap[s] = gap.why
    for seq in range(1, last + 1):
        row = by_seq[seq]
        shown = (
            seq in carried
            or (comp_ok and comp is not None and (seq <= covers or seq == comp["seq"]))
            or (
                admitted(row["sources"], sc.grants)
                and (row["kind"] is not RowKind.MESSAGE or row["body"].get("role") == "system")
            )
        )
        if seq in in_gap:
            assert seq not in carried
            assert not (comp_ok and comp is not None and (seq <= covers or seq == comp["seq"]))
        else:
            assert shown, f"row {seq} is neither in the view nor named in a gap"
        if not admitted(row["sources"], sc.grants):
            assert seq not in origins
    # A receipt accounted for as shown is shown as its notice, once: neither named in a gap nor
    # summarized, it is the view's only word that its run's work needs recall.
    receipts = [
        text_of(msgs.receipt_notice(row["body"], timestamp=0))
        for row in sc.rows
        if row["kind"] is RowKind.RECEIPT and row["seq"] > covers and row["seq"] not in in_gap
    ]
    noticed = [
        text_of(m.message)
        for m in view.messages
        if m.synthetic and m.message.get("customType") == msgs.RECEIPT_TYPE
    ]
    assert sorted(noticed) == sorted(receipts), (noticed, receipts)

    # Media: attachment limits hold; placeholders name type and size.
    total = 0
    for m in view.messages:
        for block in m.message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "image":
                limit = (
                    MEDIA.tool_media_max_bytes if m.role == "toolResult" else MEDIA.media_max_bytes
                )
                assert len(block["data"]) <= limit
                total += len(block["data"])
            elif block.get("type") == "text" and "attachment of" in block.get("text", ""):
                assert m.modified
    assert total <= MEDIA.media_max_total_bytes
    assert total == view.media_bytes

    # If everything after the coverage fits with room to spare, nothing there is left out for
    # the budget, except results whose call the view cannot carry.
    rest = sum(size_of(r["body"]) for r in sc.rows if r["seq"] > covers)
    if raw + rest + OVERHEAD + 3000 <= sc.budget:
        for seq, why in in_gap.items():
            if why is GapWhy.BUDGET and seq > covers:
                assert by_seq[seq]["body"].get("role") == "toolResult", seq


def is_opening(sc: Scenario, seq: int) -> bool:
    """A user message with text, admitted: where a window may open."""
    if seq > len(sc.rows):
        return False
    row = sc.rows[seq - 1]
    body = row["body"]
    return (
        row["kind"] is RowKind.MESSAGE
        and body.get("role") == "user"
        and bool(text_of(body).strip())
        and admitted(row["sources"], sc.grants)
    )


def call_ids(body: dict[str, Any]) -> list[Any]:
    blocks = body.get("content")
    if body.get("role") != "assistant" or not isinstance(blocks, list):
        return []
    return [b.get("id") for b in blocks if b.get("type") == "toolCall"]


def named(first: int, last: int) -> str:
    """How a gap notice names its range: "row 9", or "rows 10–41"."""
    return f"row {first} " if first == last else f"rows {first}–{last} "


# -- the scenario-side oracle of invariant 5 -----------------------------------------------------
#
# What the view must carry, computed from the generated rows alone: the tests' own units, marks,
# gaps and byte count (tether's message builders supply only the text of what tether writes
# itself: notices, quoted context, unknown-effects results, media placeholders). The core's
# estimates, reserves and exact-assembly loops play no part: every candidate view is assembled
# in full and measured with ``size_of``.

SHOWN = "shown"
Mark = GapWhy | str


def is_content(row: dict[str, Any]) -> bool:
    return row["kind"] is RowKind.MESSAGE and row["body"].get("role") != "system"


def is_result(row: dict[str, Any]) -> bool:
    return row["kind"] is RowKind.MESSAGE and row["body"].get("role") == "toolResult"


def timestamp_of(body: dict[str, Any]) -> int:
    value = body.get("timestamp")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclasses.dataclass(repr=False, eq=False)  # candidates are told apart by identity
class Expected:
    """One candidate view: the seqs of the units it carries (and whether the request is placed
    first), assembled by the oracle: carried seqs, gaps, bytes, whether media were replaced."""

    units: list[list[dict[str, Any]]]
    carried: set[int]
    gaps: list[tuple[int, int, GapWhy]]
    bytes: int
    modified: bool
    left: int = 0
    """Units read after the request placed first that were neither taken nor passed over."""

    def __repr__(self) -> str:
        return f"Expected(carried={sorted(self.carried)}, gaps={self.gaps}, bytes={self.bytes})"


class Oracle:
    """Invariant 5 from the scenario: the ordinary window, the request placed first, and the
    units a view may pass over, each assembled and measured here."""

    def __init__(
        self,
        sc: Scenario,
        request_seq: int | None,
        comp: dict[str, Any] | None,
        comp_ok: bool,
        covers: int,
        notes: list[Note],
        read_from: int,
        probed: bool,
    ) -> None:
        self.sc = sc
        self.probed = probed
        self.r = request_seq
        self.hidden = withheld(sc, request_seq)
        self.comp = comp
        self.comp_ok = comp_ok
        self.covers = covers
        self.last = len(sc.rows)
        # Invariant 9: the view weighs only rows its bounded reads returned. The tail's first row
        # (as the spy saw it) is taken as given; everything else comes from the scenario.
        self.lo = max(covers + 1, read_from)
        self.whole = read_from <= covers + 1
        tail = sc.rows[self.lo - 1 :]
        self.units = split(tail)
        self.withheld_calls = {
            c
            for row in tail
            if not admitted(row["sources"], sc.grants)
            for c in call_ids(row["body"])
        }
        req = sc.rows[request_seq - 1] if request_seq else None
        stamps = [timestamp_of(r["body"]) for r in tail if r["kind"] is RowKind.MESSAGE]
        if req is not None:
            stamps.append(timestamp_of(req["body"]))
        self.ts = max(stamps, default=0)
        top = 0
        if comp is not None and comp_ok:
            summary = comp["body"].get("summary")
            top += size_of(
                msgs.checkpoint_message(
                    summary if isinstance(summary, str) else "",
                    seq=comp["seq"],
                    run=comp["run"],
                    covers_to=covers,
                    continuation=bool(comp["body"].get("continuation")),
                    timestamp=self.ts,
                )
            )
        if notes:
            top += size_of(msgs.notes_message(AGENT, notes, timestamp=self.ts))
        self.top = top

    def opens(self, unit: list[dict[str, Any]]) -> bool:
        # A withheld request opens an exchange too: its stand-in is a user message with text.
        seq = unit[0]["seq"]
        return (
            len(unit) == 1
            and seq > self.covers
            and (is_opening(self.sc, seq) or (seq == self.r and self.hidden))
        )

    def assemble(self, units: list[list[dict[str, Any]]], placed: bool) -> Expected:
        sc, r = self.sc, self.r
        marks: dict[int, Mark] = {}
        carried: set[int] = set()
        extra = 0  # unknown-effects results and receipt notices
        media = msgs.MediaLimits(
            MEDIA.media_max_bytes, MEDIA.tool_media_max_bytes, MEDIA.media_max_total_bytes
        )
        sizes: dict[int, int] = {}
        modified = False

        def carry(row: dict[str, Any]) -> None:
            nonlocal modified
            body, changed = msgs.limit_media(row["body"], media)
            sizes[row["seq"]] = size_of(body)
            modified = modified or changed
            carried.add(row["seq"])

        if r is not None and self.hidden:
            sizes[r] = stand_in_size(sc, r, self.ts)  # no media: it shows nothing of the row
        elif r is not None:
            carry(sc.rows[r - 1])  # the request's media are counted first
            carried.discard(r)
        for unit in sorted(units, key=lambda u: -u[0]["seq"]):  # newest first, as media count
            pending: set[str] = set()
            answered: set[str] = set()
            withheld_results: set[str] = set()
            head_withheld = False
            for i, row in enumerate(unit):
                seq, ok = row["seq"], admitted(row["sources"], sc.grants)
                body = row["body"]
                if seq == r and self.hidden:
                    carried.add(seq)  # its stand-in
                    marks[seq] = SHOWN
                    continue
                if not is_content(row):
                    marks[seq] = SHOWN if ok else GapWhy.WITHHELD
                    if ok and row["kind"] is RowKind.RECEIPT:
                        extra += size_of(msgs.receipt_notice(body, timestamp=self.ts))
                elif i == 0 and call_ids(body):
                    if ok:
                        if seq != r:
                            carry(row)
                        carried.add(seq)
                        marks[seq] = SHOWN
                        pending = set(call_ids(body))
                    else:
                        marks[seq] = GapWhy.WITHHELD
                        head_withheld = True
                elif is_result(row):
                    cid = body.get("toolCallId")
                    if head_withheld:
                        marks[seq] = GapWhy.WITHHELD
                    elif cid in pending and cid not in answered:
                        if ok:
                            carry(row)
                            marks[seq] = SHOWN
                            answered.add(cid)
                        else:
                            marks[seq] = GapWhy.WITHHELD
                            withheld_results.add(cid)
                    else:
                        marks[seq] = (
                            GapWhy.WITHHELD if cid in self.withheld_calls else GapWhy.BUDGET
                        )
                elif ok:
                    if seq != r:
                        carry(row)
                    carried.add(seq)
                    marks[seq] = SHOWN
                else:
                    marks[seq] = GapWhy.WITHHELD
            head = unit[0]["body"]
            for block in head.get("content") if isinstance(head.get("content"), list) else []:
                cid = block.get("id") if block.get("type") == "toolCall" else None
                if cid in pending and cid not in answered:
                    extra += size_of(
                        msgs.unknown_result(
                            block, withheld=cid in withheld_results, timestamp=self.ts
                        )
                    )
        if placed and r is not None:
            marks[r] = SHOWN
            carried.add(r)
            # Rows between the coverage and the request are named exactly (prompt rows there
            # are not history) when they were read: by the probe (a range read, made when the
            # request lies before the first tail read), else those of the tail. A receipt there
            # is shown as its notice, as in a carried unit: not in a gap, never silently gone.
            if 0 < r - 1 - self.covers <= PROBE_ROWS:
                start = self.covers if self.probed else max(self.covers, self.lo - 1)
                between = sc.rows[start : r - 1]
                for row in between:
                    if not admitted(row["sources"], sc.grants):
                        marks[row["seq"]] = GapWhy.WITHHELD
                    elif not is_content(row):
                        marks[row["seq"]] = SHOWN
                        if row["kind"] is RowKind.RECEIPT:
                            extra += size_of(msgs.receipt_notice(row["body"], timestamp=self.ts))
        if self.comp is not None:
            marks.setdefault(self.comp["seq"], SHOWN if self.comp_ok else GapWhy.WITHHELD)
        gaps: list[tuple[int, int, GapWhy]] = []
        for seq in range(1, self.last + 1):
            covered: Mark = SHOWN if self.comp_ok else GapWhy.WITHHELD
            mark = marks.get(seq, covered if seq <= self.covers else GapWhy.BUDGET)
            if mark == SHOWN:
                continue
            assert isinstance(mark, GapWhy)
            if gaps and gaps[-1][2] is mark and gaps[-1][1] == seq - 1:
                gaps[-1] = (gaps[-1][0], seq, mark)
            else:
                gaps.append((seq, seq, mark))
        notices = sum(size_of(msgs.gap_notice(a, b, why, timestamp=self.ts)) for a, b, why in gaps)
        size = self.top + sum(sizes[s] for s in carried) + extra + notices
        return Expected(list(units), carried, gaps, size, modified)

    def fits(self, units: list[list[dict[str, Any]]], placed: bool) -> Expected | None:
        e = self.assemble(units, placed)
        return e if e.bytes <= self.sc.budget else None

    def window(self, skips: int = 0) -> Expected | None:
        """The ordinary window: the newest exchanges after the coverage that fit, opening at a
        user message with text (or at the coverage when everything after it fits); None without
        an opening that fits. With ``skips``: walking back unit by unit, a unit that alone takes
        more than the space left, while that space is at least a twentieth of the budget, is
        passed over (at most ``skips`` of them), so that the window may still reach the
        request; older exchanges are then taken whole while they fit."""
        units, budget = self.units, self.sc.budget
        passed: set[int] = set()  # heads of the units passed over
        if skips:
            taken: list[list[dict[str, Any]]] = []
            for unit in reversed(units):
                if self.fits([unit, *taken], False):
                    taken.insert(0, unit)
                elif len(passed) < skips and (
                    budget - self.assemble(taken, False).bytes >= budget // 20
                ):
                    passed.add(unit[0]["seq"])
                else:
                    break
            if not passed:
                return None  # nothing passed over: the ordinary window
            # Passed over only where the window lies: after its newest opening reached so.
            start = next((u[0]["seq"] for u in taken if self.opens(u)), None)
            if start is None:
                return None
            passed = {s for s in passed if s > start}
        elif self.whole:
            every = self.fits(units, False)  # everything after the coverage, when it all fits
            if every is not None:
                return every
        kept = [u for u in units if u[0]["seq"] not in passed]
        best: Expected | None = None
        for i in range(len(kept) - 1, -1, -1):
            if not self.opens(kept[i]):
                continue
            e = self.fits(kept[i:], False)
            if e is None:
                return best
            best = e
        if self.whole:
            return self.fits(kept, False) or best
        return best

    def expect(self) -> list[tuple[str, Expected]]:
        """What invariant 5 allows, by name: the ordinary window when it holds the previous
        request (or there is none), and nothing else. Otherwise the request placed first,
        followed by the units after it; or, when passing over units too large for the space
        left lets the window reach the request, that window (the request keeps its neighbours).
        Which of those two the view takes rests on the core's estimates of notices, which the
        oracle does not copy: either is accepted, each exactly as the oracle assembles it."""
        window = self.window()
        if window is not None and (self.r is None or self.r in window.carried):
            return [("window", window)]
        allowed = [("request placed first" if self.r else "no opening", self.placed_first())]
        passing = self.window(MAX_SKIPS) if self.r is not None else None
        if passing is not None and self.r in passing.carried:
            allowed.append(("window passing over units", passing))
        return allowed

    def next_piece(self, how: str, view: Expected) -> list[list[dict[str, Any]]]:
        """What the view would take next, read and not carried: for a window, the newest omitted
        complete exchange before it (from the nearest opening before it, or everything back to
        the coverage when there is none and the tail reaches it); after a request placed
        first, the unit just before the carried ones. Empty when nothing was left out there."""
        start = min((u[0]["seq"] for u in view.units), default=self.last + 1)
        if how.startswith("window"):
            before = [u for u in self.units if u[0]["seq"] < start]
            opening = next(
                (i for i in range(len(before) - 1, -1, -1) if self.opens(before[i])), None
            )
            if opening is not None:
                return before[opening:]
            return before if self.whole else []
        floor = max(self.covers, self.r or 0)
        before = [u for u in self.units if floor < u[0]["seq"] < start]
        return before[-1:]

    def passing_as_viewed(
        self, carried: set[int], gaps: list[tuple[int, int, GapWhy]]
    ) -> Expected | None:
        """The window passing over units as the view made it, when it is one: it opens at a user
        message with text (or at the coverage, the tail read whole), holds the request in
        place, and passes over at most MAX_SKIPS whole units, no range of which fits the view it
        left (assembled here without them). Which units the core's estimates pass over is not
        copied; that each range does not fit is checked. None when the view is not such a
        window."""
        if self.r is None or self.r not in carried or self.r <= self.covers:
            return None
        first = min(carried)
        before = [b for a, b, why in gaps if why is GapWhy.BUDGET and self.covers < b < first]
        start = max(before, default=self.covers) + 1
        # A window that reaches the coverage (the tail read whole) opens there, whatever it
        # carries first: the rows before that are then only rows a view cannot carry (results
        # whose calls the checkpoint covers, named; rows that are not history, such as the
        # compaction row itself).
        if self.whole and all(
            is_result(u[0]) or not is_content(u[0]) for u in self.units if u[0]["seq"] < first
        ):
            start = self.covers + 1
        else:
            # Rows that are not history between a named gap and the window's opening (the
            # compaction row, a receipt) belong to neither: the window opens after them.
            later = (u[0]["seq"] for u in self.units if u[0]["seq"] >= start and is_content(u[0]))
            start = next(later, start)
        unit_at = {u[0]["seq"]: u for u in self.units}
        if start not in unit_at or not (
            self.opens(unit_at[start]) or (start == self.covers + 1 and self.whole)
        ):
            return None
        budget_gaps = [(a, b) for a, b, why in gaps if why is GapWhy.BUDGET and a > start]
        passed = [u for u in self.units if any(a <= u[0]["seq"] <= b for a, b in budget_gaps)]
        kept = [u for u in self.units if u[0]["seq"] >= start and u not in passed]
        if not passed or len(passed) > MAX_SKIPS:
            return None
        view = self.assemble(kept, False)
        # No range the view passed over fits back whole. A part of a range of several units may
        # fit (the core charges each passed unit a notice of its own, where one notice names
        # the range): invariant 5's measure is the complete exchange, and these units lie
        # inside the request's own.
        for a, b in budget_gaps:
            back = [u for u in passed if a <= u[0]["seq"] <= b]
            assert self.assemble([*kept, *back], False).bytes > self.sc.budget, (a, b)
        return view

    def placed_first(self) -> Expected:
        """The request placed first (or, without one, no opening), then the newest units after
        it that fit; a unit that alone takes more than the space left, while that space is at
        least a twentieth of the budget, is passed over (at most MAX_SKIPS) and older units fill
        on."""
        floor = max(self.covers, self.r or 0)
        older = [u for u in self.units if u[0]["seq"] > floor]
        placed = self.r is not None
        taken: list[list[dict[str, Any]]] = []

        def fill() -> None:
            while older and self.fits([older[-1], *taken], placed):
                taken.insert(0, older.pop())

        fill()
        for _ in range(MAX_SKIPS):
            free = self.sc.budget - self.assemble(taken, placed).bytes
            if len(older) < 2 or free < self.sc.budget // 20:
                break
            older.pop()
            fill()
        view = self.assemble(taken, placed)
        view.left = len(older)
        return view


def split(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Units: a message with tool calls with the results (and prompt rows) right after it, or any
    single other row; prompt rows after a batch's last result belong to what follows."""
    units: list[list[dict[str, Any]]] = []
    i = 0
    while i < len(rows):
        unit = [rows[i]]
        i += 1
        if is_content(unit[0]) and call_ids(unit[0]["body"]):
            while i < len(rows) and (is_result(rows[i]) or not is_content(rows[i])):
                unit.append(rows[i])
                i += 1
            while len(unit) > 1 and not is_content(unit[-1]):
                unit.pop()
                i -= 1
        units.append(unit)
    return units


class TailSpy:
    """The ledger's reads, noting where the newest tail read began: rows before it were not
    read, so the view could not weigh them."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.read_from = 1
        self.probed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)

    def rows_range(self, *args: Any, **kwargs: Any) -> Any:
        self.probed = True
        return self.ledger.rows_range(*args, **kwargs)

    def tail(self, *args: Any, **kwargs: Any) -> Any:
        read = self.ledger.tail(*args, **kwargs)
        self.read_from = read.rows[0].seq if read.rows else (read.stop_seq or 0) + 1
        if read.stop_seq is None:
            self.read_from = 1
        return read


def load(sc: Scenario) -> Any:
    ledger = open_ledger("memory:")
    ledger.import_records(*sc.records())
    if sc.refusing:
        ledger.set_refusing("s", "pi idle unconfirmed")
    return ledger


def compaction_after_a_checkpoint() -> Scenario:
    """A session the generator found: a continuation checkpoint (row 10, covering 1-9), then a
    compaction pi made on its own (row 12) covering less (1-4), with a refused-checkpoint receipt
    (row 6) between that coverage and the previous request (row 7), and a tool result over the
    budget (row 9) after it. The newest compaction is row 12, so rows 5-9 are after the coverage;
    the receipt is shown as its notice whether the view opens at the coverage (the tail fits
    once row 9 is passed over) or places the request first: both views cost 1834 bytes."""
    sc = Scenario()
    sc.budget = 60_000
    sc.grants = ["repo:a/*"]
    ts = 1_764_410_400_000
    calls = [("c1", "read", {"path": "f1"}), ("c2", "read", {"path": "f2"})]
    calls.append(("c3", "read", {"path": "f3"}))
    agent = f"agent:{AGENT}"
    sc.add("r0", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts + 1000))
    sc.add("r0", agent, RowKind.MESSAGE, calls_message(calls, ts=ts + 2000))
    for cid, name, _ in calls:
        sc.add("r0", f"tool:{name}", RowKind.MESSAGE, tool_result(cid, name, "", ts=ts + 2000))
    refused = {"kind": "continuation_checkpoint_refused", "run": "r0", "reason": "truncated"}
    sc.add("r0", agent, RowKind.RECEIPT, refused)
    sc.runs.append(Run("r0", "s", AGENT, RunStatus.FINISHED, request_seq=1))
    sc.add("r1", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts + 4000))
    sc.add(
        "r1", agent, RowKind.MESSAGE, calls_message([("c4", "read", {"path": "f4"})], ts=ts + 5000)
    )
    sc.add(
        "r1", "tool:read", RowKind.MESSAGE, tool_result("c4", "read", "t" * 70_000, ts=ts + 5000)
    )
    checkpoint = {"version": 1, "run": "r1"}
    sc.add(
        "r1",
        agent,
        RowKind.COMPACTION,
        {"summary": "checkpoint ", "covers_to": 9, "continuation": checkpoint},
    )
    sc.runs.append(Run("r1", "s", AGENT, RunStatus.FINISHED, request_seq=7))
    sc.add("r2", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts + 6000))
    sc.add("r2", agent, RowKind.COMPACTION, {"summary": "sum ", "covers_to": 4})
    sc.runs.append(Run("r2", "s", AGENT, RunStatus.QUEUED, request_seq=11))
    sc.seal()
    return sc


class Written:
    """A session the generator found, written out: rows added by run, timestamps in seconds
    after ``ts`` (pi's are milliseconds)."""

    def __init__(self, sc: Scenario, ts: int = 1_764_410_460_000) -> None:
        self.sc, self.ts = sc, ts
        self.agent = f"agent:{AGENT}"

    def covered(
        self,
        last: int,
        requests: dict[int, str],
        request: str,
        sources: dict[int, tuple[str, ...]] | None = None,
    ) -> None:
        """Rows 1 to ``last``, which the checkpoint covers, made small: each run's request
        (``request`` formatted with its run) where ``requests`` says, else an answer "x"."""
        run = requests[min(requests)]
        for seq in range(1, last + 1):
            run = requests.get(seq, run)
            if seq in requests:
                text = request.format(run=run)
                self.sc.add(run, "user:ana", RowKind.MESSAGE, user(text, ts=self.ts))
            else:
                body = assistant("x", ts=self.ts)
                self.sc.add(run, self.agent, RowKind.MESSAGE, body, (sources or {}).get(seq, ()))

    def say(self, run: str, text: str, at: int) -> None:
        self.sc.add(run, "user:ana", RowKind.MESSAGE, user(text, ts=self.ts + at * 1000))

    def answer(self, run: str, size: int, at: int) -> None:
        body = assistant("answer: " + "a" * size, ts=self.ts + at * 1000)
        self.sc.add(run, self.agent, RowKind.MESSAGE, body)

    def call(
        self, run: str, calls: list[tuple[str, int]], at: int, sources: tuple[str, ...]
    ) -> None:
        spec = [(f"call{n}", name, {"n": n}) for name, n in calls]
        body = calls_message(spec, ts=self.ts + at * 1000)
        self.sc.add(run, self.agent, RowKind.MESSAGE, body, sources)

    def result(
        self, run: str, n: int, name: str, size: int, at: int, sources: tuple[str, ...]
    ) -> None:
        body = tool_result(f"call{n}", name, "r" * size, ts=self.ts + at * 1000)
        self.sc.add(run, f"tool:{name}", RowKind.MESSAGE, body, sources)


def window_passing_over_a_unit_that_fits() -> Scenario:
    """A session the generator found (its covered rows made small): the window that keeps the
    previous request (row 148) in place passes over units too large for the space left, by the
    estimate, which counts each omitted run's notice at its largest. Rows 150-151 were passed
    over though they fit (14,759 bytes of 15,000 with them): a unit passed over on the estimate
    is taken back where it fits exactly."""
    sc = Scenario()
    sc.budget = 15_000
    sc.grants = ["repo:*", "doc:*"]
    ts = 1_764_410_460_000
    agent = f"agent:{AGENT}"
    both, repo, doc = ("doc:hb", "repo:a/x"), ("repo:a/x",), ("doc:hb",)
    w = Written(sc, ts)
    requests = {1: "s-r0", 49: "s-r1", 74: "s-r2"}
    w.covered(145, requests, "task {run}: " + "q" * 30, {2: both})
    checkpoint = {"version": 1, "run": "s-r2"}
    body = {"summary": "checkpoint: " + "k" * 150, "covers_to": 145, "continuation": checkpoint}
    sc.add("s-r2", agent, RowKind.COMPACTION, {**body, "tokens_before": 9870})
    system = {"role": "system", "content": "", "sections": {"preamble": "p" * 120}}
    tools = [{"name": "read", "description": "Read a file", "parameters": {}}]
    system_row = {**system, "toolsAdded": tools, "timestamp": ts + 233_000}
    sc.add("s-r3", agent, RowKind.MESSAGE, system_row)

    w.say("s-r3", "task s-r3: " + "q" * 30, 233)
    w.say("s-r3", "steer: " + "v" * 45, 234)
    w.call("s-r3", [("bash", 82)], 234, ())
    w.result("s-r3", 82, "bash", 675, 234, repo)
    w.call("s-r3", [("bash", 83)], 235, repo)
    w.result("s-r3", 83, "bash", 120, 235, repo)
    w.call("s-r3", [("read", 84), ("read", 85)], 236, repo)
    w.result("s-r3", 84, "read", 450, 236, doc)
    w.result("s-r3", 85, "read", 45, 236, doc)
    w.call("s-r3", [("edit", 86), ("bash", 87)], 237, both)
    w.result("s-r3", 86, "edit", 45, 237, ())
    w.result("s-r3", 87, "bash", 45, 237, doc)
    w.call("s-r3", [("edit", 88), ("bash", 89), ("edit", 90)], 238, both)
    w.result("s-r3", 88, "edit", 45, 238, ())
    w.result("s-r3", 89, "bash", 450, 238, repo)
    w.result("s-r3", 90, "edit", 3120, 238, ())
    w.call("s-r3", [("edit", 91)], 239, both)
    w.result("s-r3", 91, "edit", 45, 239, ())
    w.say("s-r3", "steer: " + "v" * 15, 240)
    w.call("s-r3", [("bash", 92)], 240, both)
    w.result("s-r3", 92, "bash", 15, 240, repo)
    w.call("s-r3", [("read", 93), ("bash", 94), ("read", 95)], 241, both)
    w.result("s-r3", 93, "read", 75, 241, doc)
    w.result("s-r3", 94, "bash", 15, 241, repo)
    w.result("s-r3", 95, "read", 300, 241, repo)
    w.call("s-r3", [("edit", 96)], 242, both)
    w.result("s-r3", 96, "edit", 120, 242, ())
    w.call("s-r3", [("bash", 97)], 243, both)
    w.result("s-r3", 97, "bash", 180, 243, repo)
    w.call("s-r3", [("edit", 98)], 244, both)
    w.result("s-r3", 98, "edit", 1200, 244, ())
    w.call("s-r3", [("edit", 99), ("bash", 100), ("read", 101)], 245, both)
    w.result("s-r3", 99, "edit", 30, 245, ())
    w.result("s-r3", 100, "bash", 1800, 245, doc)
    w.result("s-r3", 101, "read", 30, 245, repo)
    w.say("s-r3", "steer: " + "v" * 15, 246)
    w.call("s-r3", [("bash", 102)], 246, both)
    ended = (RunStatus.FAILED, RunStatus.FINISHED, RunStatus.FINISHED, RunStatus.INTERRUPTED)
    for i, (status, request) in enumerate(zip(ended, (1, 49, 74, 148), strict=True)):
        sc.runs.append(Run(f"s-r{i}", "s", AGENT, status, request_seq=request))
    sc.notes.append(Note("s", AGENT, "note 0 " + "n" * 150, "2026-11-29T10:00:00Z"))
    sc.seal()
    return sc


def placed_first_followed_by_every_row() -> Scenario:
    """A session the generator found: the checkpoint (row 17) is withheld from the requester,
    so no window holds the previous request (row 19) and it is placed first; every row after it
    follows, so the view is the stored rows from the request on, contiguous: reused (invariant 7),
    not copied."""
    sc = Scenario()
    sc.budget = 2500
    ts = 1_764_410_401_000
    agent = f"agent:{AGENT}"
    refused = {"kind": "continuation_checkpoint_refused", "run": "r0", "reason": "truncated"}
    sc.add("r0", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts))
    sc.add("r0", agent, RowKind.MESSAGE, assistant("", ts=ts + 1000))
    sc.add("r0", agent, RowKind.MESSAGE, assistant("", ts=ts + 2000))
    sc.add(
        "r0", agent, RowKind.MESSAGE, calls_message([("c1", "read", {"path": "f1"})], ts=ts + 3000)
    )
    sc.add("r0", "tool:read", RowKind.MESSAGE, tool_result("c1", "read", "", ts=ts + 3000))
    sc.add("r0", agent, RowKind.RECEIPT, refused)
    sc.add("r0", agent, RowKind.RECEIPT, refused)
    sc.add(
        "r1", "system", RowKind.MESSAGE, {"role": "system", "content": "", "timestamp": ts + 5000}
    )
    sc.add("r1", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts + 6000))
    sc.add("r1", agent, RowKind.MESSAGE, assistant("", ts=ts + 7000))
    sc.add(
        "r2", "system", RowKind.MESSAGE, {"role": "system", "content": "", "timestamp": ts + 7000}
    )
    sc.add("r2", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts + 8000))
    calls = [("c2", "read", {"path": "f2"}), ("c3", "read", {"path": "f3"})]
    calls.append(("c4", "read", {"path": "f4"}))
    sc.add("r2", agent, RowKind.MESSAGE, calls_message(calls, ts=ts + 9000))
    for cid, _, _ in calls:
        sources = ("repo:a/x",) if cid == "c4" else ()
        sc.add(
            "r2", "tool:read", RowKind.MESSAGE, tool_result(cid, "read", "", ts=ts + 9000), sources
        )
    sc.add("r2", agent, RowKind.COMPACTION, {"summary": "sum ", "covers_to": 15}, ("repo:a/x",))
    sc.add("r2", agent, RowKind.MESSAGE, assistant("", ts=ts + 11000))
    sc.add("r3", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts + 12000))
    sc.add(
        "r3", agent, RowKind.MESSAGE, calls_message([("c5", "read", {"path": "f5"})], ts=ts + 13000)
    )
    sc.add("r4", "user:ana", RowKind.MESSAGE, user("REQTEXT ", ts=ts + 14000))
    statuses = [RunStatus.QUEUED] * 3 + [RunStatus.FINISHED, RunStatus.QUEUED]
    for i, (status, request) in enumerate(zip(statuses, (1, 9, 12, 19, 21), strict=True)):
        sc.runs.append(Run(f"r{i}", "s", AGENT, status, request_seq=request))
    sc.notes.append(Note("s", AGENT, "note 0 ", "2026-11-29T10:00:00Z"))
    sc.seal()
    return sc


def placed_first_growing_past_its_exact_tries() -> Scenario:
    """A session the generator found (its withheld exchanges written as a loop): the request
    (row 15) is placed first, its run's rows from 30 on are withheld from the requester, and
    the rows before the request leave five named gaps, whose notices the estimate reserves at
    their largest. So nothing fits by the estimate, and the view grows by exact checks only.
    It stopped after EXACT_TRIES (16) units and passed over the next one (rows 30-31, named as
    a budget gap) though it fits: 3,313 bytes of 6,000 with it. Growth ends only at a unit that
    does not fit."""
    sc = Scenario()
    sc.budget = 6000
    sc.grants = ["repo:a/*"]
    ts = 1_764_410_460_000
    both, repo, doc = ("doc:hb", "repo:a/x"), ("repo:a/x",), ("doc:hb",)
    tools = [{"name": "read", "description": "Read a file", "parameters": {}}]

    def system(run: str, actor: str, preamble: int, at: int) -> None:
        body = {"role": "system", "content": "", "sections": {"preamble": "p" * preamble}}
        sc.add(run, actor, RowKind.MESSAGE, {**body, "toolsAdded": tools, "timestamp": ts + at})

    def call(run: str, actor: str, names: list[str], at: int, sources: tuple[str, ...]) -> None:
        n = sum(len(call_ids(r["body"])) for r in sc.rows)
        spec = [(f"call{n + i + 1}", name, {"n": n + i + 1}) for i, name in enumerate(names)]
        sc.add(run, actor, RowKind.MESSAGE, calls_message(spec, ts=ts + at), sources)

    def results(run: str, sizes: list[tuple[int, tuple[str, ...]]], at: int) -> None:
        head = next(r for r in reversed(sc.rows) if call_ids(r["body"]))
        for block, (size, sources) in zip(head["body"]["content"], sizes, strict=True):
            body = tool_result(block["id"], block["name"], "r" * size, ts=ts + at)
            sc.add(run, f"tool:{block['name']}", RowKind.MESSAGE, body, sources)

    other, rev = "agent:other", f"agent:{AGENT}"
    system("s-r0", other, 240, 0)
    sc.add("s-r0", "user:ana", RowKind.MESSAGE, user("task s-r0: " + "q" * 120, ts=ts))
    call("s-r0", other, ["read"], 1000, ())
    results("s-r0", [(6, repo)], 1000)
    call("s-r0", other, ["edit", "bash", "bash"], 2000, repo)
    results("s-r0", [(720, ()), (120, doc), (6, repo)], 2000)
    call("s-r0", other, ["bash"], 3000, both)
    results("s-r0", [(48, doc)], 3000)
    call("s-r0", other, ["bash"], 4000, both)
    results("s-r0", [(18, repo)], 4000)
    sc.add("s-r0", other, RowKind.MESSAGE, assistant("answer: " + "a" * 48, ts=ts + 5000))
    system("s-r1", rev, 48, 65_000)
    sc.add("s-r1", "user:ana", RowKind.MESSAGE, user("task s-r1: " + "q" * 120, ts=ts + 65_000))
    sc.add("s-r1", "user:ana", RowKind.MESSAGE, user("steer: " + "v" * 6, ts=ts + 66_000))
    call("s-r1", rev, ["edit"], 66_000, ())
    results("s-r1", [(120, ())], 66_000)
    call("s-r1", rev, ["edit", "read"], 67_000, ())
    results("s-r1", [(6, ()), (72, repo)], 67_000)
    call("s-r1", rev, ["bash", "edit", "read"], 68_000, repo)
    results("s-r1", [(18, repo), (480, ()), (720, repo)], 68_000)
    call("s-r1", rev, ["edit", "edit", "read"], 69_000, repo)
    results("s-r1", [(72, ()), (720, ()), (18, doc)], 69_000)
    # Rows 30-69: exchanges whose calls name a source the requester may not read.
    exchanges = [
        [(720, ())], [(48, repo), (6, doc)], [(30, ())], [(6, repo)], [(18, ())], [(12, repo)],
        [(12, ())], [(30, doc)], [(72, repo)], [(180, repo)], [(270, doc)],
        [(12, repo), (48, doc)], [(18, ()), (6, repo), (6, repo)], [(18, repo)],
        [(270, repo), (18, ()), (270, repo)], [(18, ())], [(48, repo)],
    ]  # fmt: skip
    for i, sizes in enumerate(exchanges):
        at = 70_000 + 1000 * i
        call("s-r1", rev, ["edit"] * len(sizes), at, both)
        results("s-r1", sizes, at)
    sc.runs.append(Run("s-r0", "s", "other", RunStatus.FINISHED, request_seq=2))
    sc.runs.append(Run("s-r1", "s", AGENT, RunStatus.FAILED, request_seq=15))
    sc.notes.append(Note("s", AGENT, "note 0 " + "n" * 60, "2026-11-29T10:00:00Z"))
    sc.seal()
    return sc


def window_reaching_the_coverage() -> Scenario:
    """The checkpoint (row 12) covers rows 1-9, and row 9's calls have their results after it
    (rows 10-11). The request (row 14) is followed by an answer too large for the space left
    (row 15): the window passes over it and reaches back to the coverage, carrying row 13 (an
    answer) first, with rows 10-11 named (their calls are not in the view). The generator found
    such a session where the core's estimates passed over other units than the oracle's walk:
    the oracle then checks the view as the core made it (passing_as_viewed)."""
    sc = Scenario()
    sc.budget = 2700
    ts = 1_764_410_460_000
    agent = f"agent:{AGENT}"
    sc.add("r0", "user:ana", RowKind.MESSAGE, user("task r0", ts=ts))
    for seq in range(2, 9):
        sc.add("r0", agent, RowKind.MESSAGE, assistant(f"a{seq}", ts=ts + seq))
    calls = [("ca", "read", {}), ("cb", "read", {})]
    sc.add("r0", agent, RowKind.MESSAGE, calls_message(calls, ts=ts + 9))
    for cid, text in (("ca", "x"), ("cb", "y")):
        sc.add("r0", "tool:read", RowKind.MESSAGE, tool_result(cid, "read", text, ts=ts + 10))
    sc.add("r0", agent, RowKind.COMPACTION, {"summary": "sum", "covers_to": 9})
    sc.add("r0", agent, RowKind.MESSAGE, assistant("done r0", ts=ts + 13))
    sc.add("r1", "user:ana", RowKind.MESSAGE, user("task r1", ts=ts + 14))
    sc.add("r1", agent, RowKind.MESSAGE, assistant("z" * 3000, ts=ts + 15))
    sc.add("r1", agent, RowKind.MESSAGE, assistant("small", ts=ts + 16))
    sc.add("r1", agent, RowKind.MESSAGE, assistant("end", ts=ts + 17))
    sc.runs.append(Run("r0", "s", AGENT, RunStatus.FINISHED, request_seq=1))
    sc.runs.append(Run("r1", "s", AGENT, RunStatus.FINISHED, request_seq=14))
    sc.seal()
    return sc


def window_opening_after_the_compaction_row() -> Scenario:
    """A session the generator found (its covered rows made small): the checkpoint (row 176)
    covers rows 1-173, and the exchange after it that the window opens (row 177, a user
    message) follows the compaction row, after a named gap (174-175). The window passes over
    rows 185-189 and holds the request (row 184); walking back unit by unit, the batch 178-181
    alone does not fit (row 177 is then a gap of its own, with a notice), but the exchange from
    row 177 does: 14,995 bytes of 15,000. The core's view is that exchange; the oracle checks
    it as such a window, opening at row 177 past the compaction row."""
    sc = Scenario()
    sc.budget = 15_000
    sc.grants = ["repo:*", "doc:*"]
    both, repo, doc = ("doc:hb", "repo:a/x"), ("repo:a/x",), ("doc:hb",)
    w = Written(sc)
    agent = w.agent
    w.covered(173, {2: "s-r0", 78: "s-r1", 92: "s-r2"}, "task {run}")
    w.call("s-r2", [("bash", 103)], 182, both)  # 174
    w.result("s-r2", 103, "bash", 3120, 182, doc)  # 175
    summary = {"summary": "pi summary: " + "c" * 75, "covers_to": 173, "tokens_before": 15255}
    sc.add("s-r2", agent, RowKind.COMPACTION, summary)  # 176
    w.say("s-r2", "steer: " + "v" * 15, 183)  # 177
    w.call("s-r2", [("read", 104), ("bash", 105), ("bash", 106)], 183, both)  # 178
    w.result("s-r2", 104, "read", 120, 183, doc)  # 179
    w.result("s-r2", 105, "bash", 450, 183, repo)  # 180
    w.result("s-r2", 106, "bash", 30, 183, doc)  # 181
    w.answer("s-r2", 120, 184)  # 182
    refused = {"kind": "continuation_checkpoint_refused", "run": "s-r2", "reason": "truncated"}
    sc.add("s-r2", agent, RowKind.RECEIPT, refused)  # 183
    w.say("s-r3", "task s-r3: " + "q" * 75, 244)  # 184
    w.call("s-r3", [("read", 107)], 245, ())  # 185
    w.result("s-r3", 107, "read", 1800, 245, repo)  # 186
    w.call("s-r3", [("edit", 108), ("bash", 109)], 246, repo)  # 187
    w.result("s-r3", 108, "edit", 120, 246, ())  # 188
    w.result("s-r3", 109, "bash", 3120, 246, repo)  # 189
    w.call("s-r3", [("read", 110), ("edit", 111)], 247, repo)  # 190
    w.result("s-r3", 110, "read", 45, 247, repo)  # 191
    w.result("s-r3", 111, "edit", 30, 247, ())  # 192
    w.call("s-r3", [("bash", 112)], 248, repo)  # 193
    w.result("s-r3", 112, "bash", 15, 248, repo)  # 194
    w.call("s-r3", [("bash", 113)], 249, repo)  # 195
    w.result("s-r3", 113, "bash", 1200, 249, repo)  # 196
    w.call("s-r3", [("read", 114)], 250, repo)  # 197
    w.result("s-r3", 114, "read", 75, 250, repo)  # 198
    w.say("s-r3", "steer: " + "v" * 45, 251)  # 199
    w.call("s-r3", [("edit", 115)], 251, repo)  # 200
    w.result("s-r3", 115, "edit", 75, 251, ())  # 201
    w.call("s-r3", [("edit", 116)], 252, repo)  # 202
    w.result("s-r3", 116, "edit", 75, 252, ())  # 203
    w.call("s-r3", [("bash", 117), ("read", 118), ("bash", 119)], 253, repo)  # 204
    w.result("s-r3", 117, "bash", 15, 253, repo)  # 205
    w.result("s-r3", 118, "read", 15, 253, repo)  # 206
    w.result("s-r3", 119, "bash", 300, 253, doc)  # 207
    w.call("s-r3", [("bash", 120), ("read", 121)], 254, both)  # 208
    w.result("s-r3", 120, "bash", 75, 254, repo)  # 209
    w.result("s-r3", 121, "read", 45, 254, repo)  # 210
    w.call("s-r3", [("read", 122)], 255, both)  # 211
    w.result("s-r3", 122, "read", 120, 255, doc)  # 212
    w.call("s-r3", [("read", 123)], 256, both)  # 213
    w.result("s-r3", 123, "read", 30, 256, doc)  # 214
    w.call("s-r3", [("bash", 124)], 257, both)  # 215
    w.result("s-r3", 124, "bash", 120, 257, repo)  # 216
    w.call("s-r3", [("bash", 125), ("bash", 126)], 258, both)  # 217
    w.result("s-r3", 125, "bash", 30, 258, doc)  # 218
    w.result("s-r3", 126, "bash", 1200, 258, repo)  # 219
    w.answer("s-r3", 15, 259)  # 220
    ended = (RunStatus.INTERRUPTED, RunStatus.FINISHED, RunStatus.FINISHED, RunStatus.FINISHED)
    for i, (status, request) in enumerate(zip(ended, (2, 78, 92, 184), strict=True)):
        sc.runs.append(Run(f"s-r{i}", "s", AGENT, status, request_seq=request))
    sc.seal()
    return sc


def view_of(sc: Scenario) -> tuple[FollowupView | Refusal, TailSpy]:
    """The agent's view of ``sc``'s session for its actor, built through a :class:`TailSpy`
    (which still says what was read once the ledger is closed)."""
    with load(sc) as ledger:
        reads = TailSpy(ledger)
        view = build_view(
            reads,
            session="s",
            agent=AGENT,
            actor=ACTOR,
            budget=sc.budget,
            config=MEDIA,
            grants={ACTOR: sc.grants},
        )
    return view, reads


def test_a_receipt_after_a_shorter_compaction_is_one_notice_whichever_view() -> None:
    """The session of :func:`compaction_after_a_checkpoint`, by hand: the view, and the two
    views the oracle allows for it, which carry the same rows and so must cost the same."""
    sc = compaction_after_a_checkpoint()
    view, reads = view_of(sc)
    assert isinstance(view, FollowupView), view
    # The newest compaction is the newest row of either kind (row 12), with its own coverage.
    assert view.checkpoint is not None
    assert (view.checkpoint.seq, view.checkpoint.covers_to) == (12, 4)
    assert not view.checkpoint.continuation
    assert view.previous_request is not None
    assert (view.previous_request.seq, view.previous_request.mode) == (7, RequestMode.COPIED)
    assert [(g.first, g.last, g.why) for g in view.gaps] == [
        (5, 5, GapWhy.BUDGET),
        (8, 9, GapWhy.BUDGET),
    ]
    kinds = [m.origin or m.message.get("customType") for m in view.messages]
    assert kinds == ["tether.checkpoint", "tether.gap", "tether.receipt", 7, "tether.gap", 11]
    [notice] = [m for m in view.messages if m.message.get("customType") == "tether.receipt"]
    assert "Run r0 could not write a continuation checkpoint (truncated)" in text_of(notice.message)
    assert view.bytes == sum(size_of(m.message) for m in view.messages) == 1834
    # Both views the oracle allows carry rows 7 and 11 and name gaps 5 and 8-9, the receipt
    # shown as its notice in each.
    _, request_seq = expected_request(sc)
    comp = sc.rows[11]
    oracle = Oracle(sc, request_seq, comp, True, 4, [], reads.read_from, reads.probed)
    allowed = oracle.expect()
    assert [how for how, _ in allowed] == ["request placed first", "window passing over units"]
    for _, e in allowed:
        assert (e.carried, e.gaps, e.bytes) == (
            {7, 11},
            [(5, 5, GapWhy.BUDGET), (8, 9, GapWhy.BUDGET)],
            1834,
        )


def test_a_window_passing_over_units_may_open_at_the_coverage() -> None:
    """The view of :func:`window_reaching_the_coverage`, and the oracle's check of a window as
    the core made it: it opens at the coverage (the rows before row 13 are results whose calls
    the checkpoint covers, and the compaction row), so it is such a window, not a view that
    opens nowhere."""
    sc = window_reaching_the_coverage()
    view, reads = view_of(sc)
    assert isinstance(view, FollowupView), view
    gaps = [(g.first, g.last, g.why) for g in view.gaps]
    assert gaps == [(10, 11, GapWhy.BUDGET), (15, 15, GapWhy.BUDGET)]
    carried = {m.origin for m in view.messages if m.origin is not None}
    assert carried == {13, 14, 16, 17}
    oracle = Oracle(sc, 14, sc.rows[11], True, 9, [], reads.read_from, reads.probed)
    passing = oracle.passing_as_viewed(carried, gaps)
    assert passing is not None
    assert (passing.carried, passing.gaps, passing.bytes) == (carried, gaps, view.bytes)


def exchanges_with_withheld_results(exchanges: int = 200, calls: int = 6) -> Scenario:
    """A user message and a batch of ``calls`` reads, every other result withheld from the
    requester, ``exchanges`` times: every unit has omitted runs inside, each of whose notices
    the estimate counts at its largest (33 bytes over, here), so the window holds more than
    the estimate reaches."""
    sc = Scenario()
    sc.budget = 200_000
    sc.grants = ["repo:*"]
    ts = 1_764_410_460_000
    for i in range(exchanges):
        at = ts + 1000 * i
        sc.add("r0", "user:ana", RowKind.MESSAGE, user(f"q{i}", ts=at))
        batch = [(f"c{i}_{j}", "read", {}) for j in range(calls)]
        sc.add("r0", f"agent:{AGENT}", RowKind.MESSAGE, calls_message(batch, ts=at), ("repo:a/x",))
        for j, (cid, _, _) in enumerate(batch):
            sources = ("doc:hb",) if j % 2 else ("repo:a/x",)
            sc.add(
                "r0", "tool:read", RowKind.MESSAGE, tool_result(cid, "read", "r", ts=at), sources
            )
    request = len(sc.rows) - calls - 1
    sc.runs.append(Run("r0", "s", AGENT, RunStatus.FINISHED, request_seq=request))
    sc.seal()
    return sc


@settings(phases=[Phase.explicit], deadline=None)
@given(st.integers())
@example(1)
@example(2)
def test_a_window_grows_past_its_estimate_until_an_exchange_does_not_fit(tries: int) -> None:
    """The window's estimate falls short of what fits by a few exchanges here; beyond it, the
    view grows by exact checks, EXACT_TRIES at a time, then by the estimate made again from
    the exact size. With the tries cut to one or two, growth must still end only at an
    exchange that does not fit (the oracle's window: invariant 5); it ended after the tries."""
    sc = exchanges_with_withheld_results()
    with mock.patch.object(followup_core, "EXACT_TRIES", tries):
        view, reads = view_of(sc)
    check(sc, view, reads.read_from, reads.probed)
    assert isinstance(view, FollowupView)
    assert view.bytes > sc.budget - 2000, view.bytes


# 800 generated sessions in `make test`; 100 in the unit tier (`make test-fast`, the inner loop),
# where 800 alone took longer than the tier's whole budget on this machine.
EXAMPLES = 100 if os.environ.get("TETHER_TEST_TIER") == "unit" else 800


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
@example(compaction_after_a_checkpoint())
@example(window_passing_over_a_unit_that_fits())
@example(placed_first_followed_by_every_row())
@example(placed_first_growing_past_its_exact_tries())
@example(window_reaching_the_coverage())
@example(window_opening_after_the_compaction_row())
def test_generated_sessions_keep_every_invariant(sc: Scenario) -> None:
    view, reads = view_of(sc)
    check(sc, view, reads.read_from, reads.probed)
    # What the generated views exercised (shown with --hypothesis-show-statistics).
    if isinstance(view, Refusal):
        event(f"refused: {view.reason.value}")
        return
    event(
        f"previous request: {view.previous_request.mode.value if view.previous_request else None}"
    )
    event(f"checkpoint: {view.checkpoint is not None}")
    for why in sorted({g.why.value for g in view.gaps}):
        event(f"gap: {why}")
    if any(m.synthetic and m.role == "toolResult" for m in view.messages):
        event("synthetic tool result")
    if any(m.modified for m in view.messages):
        event("media placeholder")
    if view.media_bytes:
        event("media carried")


@settings(max_examples=EXAMPLES // 4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(min_value=1, max_value=3))
def test_generated_sessions_keep_every_invariant_whatever_the_exact_tries(
    sc: Scenario, tries: int
) -> None:
    """The core checks what its estimate leaves out exactly, EXACT_TRIES units at a time, and
    then estimates again: how many it checks at a time changes its work, never the view
    (invariant 5). Generated sessions again, with one to three tries at a time."""
    with mock.patch.object(followup_core, "EXACT_TRIES", tries):
        view, reads = view_of(sc)
    check(sc, view, reads.read_from, reads.probed)
