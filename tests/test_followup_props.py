"""Generated sessions, checked against every follow-up invariant (DESIGN 1–8, 18).

Sessions are made of runs of two agents with every ending status; requests that are complete,
partial, missing or never recorded; tool calls with and without results, parallel calls, rows
larger than the budget, media in requests and tool results, receipts, compactions anywhere (pi's
own mid-run and continuation checkpoints), notes, and sources that the requester may or may not
be granted. Each view is checked with the tests' own byte count and an oracle for the previous
request written from the design's words.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from typing import Any

from hypothesis import HealthCheck, event, given, settings
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
from tether.ledger import Note, RowKind, Run, RunStatus, open_ledger

AGENT = "rev"
ACTOR = "user:req"
SOURCES = ["repo:a/x", "repo:b/y", "doc:hb"]
PATTERNS = ["repo:a/*", "repo:*", "doc:hb", "doc:*"]
ENDED = {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED}
MEDIA = FollowupConfig(media_max_bytes=400, tool_media_max_bytes=250, media_max_total_bytes=700)
# What tether may add around the protected context (wrappers, notices): a generous bound used
# only to decide when a protected-context refusal would be unjustified.
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
        text = "request " + "r" * draw(sizes)
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
            draw(maybe_sources),
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
    of the agent that has a session record; or why the view is refused."""
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
        if not admitted(row["sources"], sc.grants):
            return RefusalReason.ACCESS_DENIED, None
        return None, run.request_seq
    return None, None


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def check(sc: Scenario, view: FollowupView | Refusal, read_from: int = 1) -> None:
    by_seq = {r["seq"]: r for r in sc.rows}
    last = len(sc.rows)
    refusal, request_seq = expected_request(sc)
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
    raw = (
        (size_of(by_seq[request_seq]["body"]) if request_seq else 0)
        + (len(comp["body"]["summary"].encode()) if comp_ok and comp else 0)
        + sum(len(n.text.encode()) for n in notes)
    )
    if isinstance(view, Refusal):
        # Invariant 4: only when the protected context (with its wrappers) is over the budget.
        assert view.reason is RefusalReason.PROTECTED_CONTEXT_OVER_BUDGET, view
        assert raw + OVERHEAD > sc.budget
        return
    assert raw <= sc.budget, "protected context over the budget must refuse"

    # 1. bytes ≤ budget, with our own count; media never count.
    assert view.bytes == sum(size_of(m.message) for m in view.messages)
    assert view.bytes <= sc.budget

    # 2. The newest compaction is read whatever the tail holds (when admitted).
    covers = 0
    if comp is not None:
        covers = min(comp["body"]["covers_to"], comp["seq"] - 1)
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
    if request_seq is None:
        assert view.previous_request is None
    else:
        assert view.previous_request is not None
        assert view.previous_request.seq == request_seq
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

    # 5 and 18. Carried rows: after the coverage, admitted, as stored. Ordinary reuse first: only
    # a view whose rows after the request were cut for the budget (or whose request is covered)
    # places the request first, and then carries nothing before it. Both ways pass over units too
    # large for the space left, so where the budget gaps lie after the request does not tell
    # them apart: a row carried between the coverage and the request means the window (which
    # may skip the units after the request); nothing carried there, with rows after the request
    # cut for the budget, means it may have been placed first (followed by the newest units
    # after it that fit, possibly the ones right after it), and then rows before it are never
    # the view's to take.
    budget_seqs = {
        s for g in view.gaps if g.why is GapWhy.BUDGET for s in range(g.first, g.last + 1)
    }
    placed_first = False
    if request_seq is not None:
        carried_before = any(covers < s < request_seq for s in origins)
        placed_first = request_seq <= covers or (
            not carried_before and any(s > request_seq for s in budget_seqs)
        )
    floor = max(covers, request_seq or 0) if placed_first else covers
    for seq, m in origins.items():
        row = by_seq[seq]
        assert seq == request_seq or seq > floor
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
            seq in origins
            or (comp_ok and comp is not None and (seq <= covers or seq == comp["seq"]))
            or (
                admitted(row["sources"], sc.grants)
                and (row["kind"] is not RowKind.MESSAGE or row["body"].get("role") == "system")
            )
        )
        if seq in in_gap:
            assert seq not in origins
            assert not (comp_ok and comp is not None and (seq <= covers or seq == comp["seq"]))
        else:
            assert shown, f"row {seq} is neither in the view nor named in a gap"
        if not admitted(row["sources"], sc.grants):
            assert seq not in origins

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

    # 5. The budget is used: when rows after the floor are omitted for the budget, the space left
    # is smaller than what the view would take next: the newest omitted complete exchange when
    # the carried rows open at one (a user message with text), else the unit just before them.
    carried_after = [s for s in origins if s > floor]
    start = min(carried_after, default=last + 1)
    # A result whose call lies at or before the floor (or nowhere) can never be carried.
    omitted = [
        s
        for s in range(floor + 1, start)
        if s in budget_seqs
        and (
            by_seq[s]["body"].get("role") != "toolResult"
            or any(
                by_seq[s]["body"].get("toolCallId") in call_ids(by_seq[c]["body"])
                for c in range(floor + 1, s)
            )
        )
    ]
    if omitted:
        rows = next_piece(sc, floor, start, omitted[-1])
        free = sc.budget - view.bytes
        # The tail read stops at twice the budget in stored bytes (withheld rows and prompt
        # snapshots cost the view nothing but take stored bytes).
        if sum(size_of(r["body"]) for r in sc.rows[rows[0]["seq"] - 1 :]) > 2 * sc.budget:
            event("budget used: limited by the bounded read")
            return
        # Rows the last tail read did not reach (it starts at ``read_from``) are read again only
        # when the space left is at least a twentieth of the budget (invariant 9: bounded reads).
        if rows[0]["seq"] < read_from and free < sc.budget // 20:
            event("budget used: limited by the bounded read")
            return
        assert free < cost_bound(sc, rows), (free, [r["seq"] for r in rows], view.gaps)
        event("budget used: " + ("exchange" if is_opening(sc, start) else "unit"))


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


def next_piece(sc: Scenario, floor: int, start: int, newest: int) -> list[dict[str, Any]]:
    """What the view would take next before ``start``: the exchange ending there (from the
    nearest user message with text after ``floor``) when ``start`` opens one, else the unit
    ending at ``newest``, the newest row omitted for the budget (a batch of calls and its
    results, or one message)."""
    if is_opening(sc, start):
        before = sc.rows[floor : start - 1]
        for i in range(len(before) - 1, -1, -1):
            if is_opening(sc, before[i]["seq"]):
                return before[i:]
        return before
    before = sc.rows[floor:newest]
    j = len(before) - 1
    if before[j]["body"].get("role") == "toolResult":
        cid = before[j]["body"].get("toolCallId")
        for i in range(j, -1, -1):
            if cid in call_ids(before[i]["body"]):
                return before[i:]
    return before[j:]


def call_ids(body: dict[str, Any]) -> list[Any]:
    blocks = body.get("content")
    if body.get("role") != "assistant" or not isinstance(blocks, list):
        return []
    return [b.get("id") for b in blocks if b.get("type") == "toolCall"]


def cost_bound(sc: Scenario, rows: list[dict[str, Any]]) -> int:
    """An upper bound of what ``rows`` take: their stored sizes (what the bounded tail read
    counts, prompt snapshots and withheld rows included), and room for what tether writes around
    them (unknown-effects results, receipt notices, notices for withheld rows inside, media
    placeholders)."""
    total = 50
    for row in rows:
        body = row["body"]
        total += size_of(body)
        if not admitted(row["sources"], sc.grants):
            total += 450
        elif row["kind"] is RowKind.RECEIPT:
            total += 400
        elif row["kind"] is RowKind.MESSAGE:
            total += 700 * len(call_ids(body))
            blocks = body.get("content") if isinstance(body.get("content"), list) else []
            total += 200 * sum(1 for b in blocks if b.get("type") == "image")
    return total


def named(first: int, last: int) -> str:
    """How a gap notice names its range: "row 9", or "rows 10–41"."""
    return f"row {first} " if first == last else f"rows {first}–{last} "


class TailSpy:
    """The ledger's reads, noting where the newest tail read began: rows before it were not
    read, so the view could not weigh them."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.read_from = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)

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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_generated_sessions_keep_every_invariant(sc: Scenario) -> None:
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
    check(sc, view, reads.read_from)
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
