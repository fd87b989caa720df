"""The functional core of the follow-up view: pure steps over what the bounded reads returned
(:class:`Inputs`, filled by :func:`tether.followup.build.read_inputs`).

Invariant 5: **ordinary reuse first**. The window is the newest units of the tail
(a message, or a batch of calls with its results) that fit, opened at a usable boundary: a user
message with text, or the first row after the coverage when everything after it fits. If the
window holds the previous request it is the view as it stands, earlier rows included
(``reused``). When it cannot hold the request only because a unit alone takes more than the
space left (over a twentieth of the budget), that unit is passed over and named (at most
:data:`MAX_SKIPS` of them; one passed over on the estimate is taken back when it fits exactly), so
the request keeps its neighbours (``copied``: no longer contiguous). Only otherwise is the
request placed first and followed by the newest units after it that fit, passing over such units
the same way (reading the tail again at its bound when the rows before them were not read).
Every estimate is checked by assembling the view exactly, then grown while more fits: whole
exchanges for the window, units after a request placed first.

Every seq of the session is accounted for: covered by the quoted checkpoint, the checkpoint row
itself, the previous request, carried as a message, prompt state or a receipt (not history: the
new run has its own prompt, and a receipt becomes a notice), or inside a named gap.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from tether.access import Admission
from tether.config import FollowupConfig
from tether.followup import messages as msgs
from tether.followup.view import (
    SYNTHETIC_ACTOR,
    Checkpoint,
    FollowupView,
    Gap,
    GapWhy,
    PreviousRequest,
    Refusal,
    RefusalReason,
    RequestMode,
    ViewMessage,
)
from tether.ledger.models import Note, Row, RowKind, Run
from tether.sizes import measure

__all__ = ["MAX_SKIPS", "PROBE_ROWS", "Inputs", "compose_view", "coverage"]

PROBE_ROWS = 16
"""Rows read between the checkpoint's coverage and the request to name that gap exactly."""
EXACT_TRIES = 16
"""Exchanges (or units) tried beyond the estimate, each checked by assembling the view exactly,
before the rest is estimated again from the exact size."""
MAX_SKIPS = 3
"""Units too large for the space left that the view may pass over (each a named gap)."""

# Non-history rows: prompt state and receipts. The new run has its own prompt; a receipt becomes
# a notice; the newest compaction is quoted at the top.
_PROMPT_ROLES = frozenset({"system"})


class _Mark(enum.Enum):
    SHOWN = "shown"
    """Represented: carried, summarized, quoted, or not history."""
    BUDGET = "budget"
    WITHHELD = "withheld"
    READ_CAP = "read_cap"
    ERASED = "erased"


_WHY = {
    _Mark.BUDGET: GapWhy.BUDGET,
    _Mark.WITHHELD: GapWhy.WITHHELD,
    _Mark.READ_CAP: GapWhy.READ_CAP,
    _Mark.ERASED: GapWhy.ERASED,
}


# -- rows ----------------------------------------------------------------------------------------


def _timestamp(body: dict[str, Any]) -> int:
    value = body.get("timestamp")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _is_content(row: Row) -> bool:
    return row.kind is RowKind.MESSAGE and row.body.get("role") not in _PROMPT_ROLES


def _calls(row: Row) -> list[dict[str, Any]]:
    if row.kind is not RowKind.MESSAGE or row.body.get("role") != "assistant":
        return []
    content = row.body.get("content")
    if not isinstance(content, list):
        return []
    return [
        b
        for b in content
        if isinstance(b, dict) and b.get("type") == "toolCall" and isinstance(b.get("id"), str)
    ]


def _is_result(row: Row) -> bool:
    return row.kind is RowKind.MESSAGE and row.body.get("role") == "toolResult"


def request_problem(row: Row) -> str | None:
    """Why a row is not a complete request (a user message with text), or None when it is."""
    if row.kind is not RowKind.MESSAGE:
        return f"row {row.seq} is a {row.kind.value} row, not a user message"
    role = row.body.get("role")
    if role != "user":
        return f"row {row.seq} is a {role!r} message, not the user's request"
    content = row.body.get("content")
    texts: list[str] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        texts.extend(
            b["text"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    if not any(t.strip() for t in texts):
        return f"row {row.seq} is a user message without request text"
    return None


def idle_bytes(rows: Sequence[Row], admission: Admission) -> int:
    """Stored bytes of rows the view never carries as messages: prompt state, receipts,
    compactions, withheld rows and the results of withheld calls."""
    withheld_calls: set[str] = set()
    idle = 0
    for row in rows:
        if not admission.admits(row.sources):
            withheld_calls.update(str(c["id"]) for c in _calls(row))
            idle += row.bytes
        elif not _is_content(row) or (
            _is_result(row) and row.body.get("toolCallId") in withheld_calls
        ):
            idle += row.bytes
    return idle


def coverage(comp: Row | None) -> int:
    """The last seq the compaction summarizes (0 without one), never past the row itself."""
    if comp is None:
        return 0
    raw = comp.covers_to
    return max(0, min(raw if raw is not None else 0, comp.seq - 1))


def gaps_of(
    last: int,
    covers: int,
    covered: _Mark,
    marks: Mapping[int, _Mark],
    unread: tuple[int, _Mark] = (0, _Mark.BUDGET),
    erased: Sequence[tuple[int, int]] = (),
) -> list[Gap]:
    """The omitted ranges of seqs ``1..last``: seqs up to ``covers`` default to ``covered``, those
    after it and before ``unread[0]`` (the tail's first row) to ``unread[1]``, the rest to
    BUDGET; the ``erased`` ranges (sorted, disjoint: seqs the reads found missing) are ERASED,
    and ``marks`` override single seqs (rows that exist). Neighbours with the same reason
    merge."""
    read_from, unread_mark = unread
    gaps: list[Gap] = []

    def add(lo: int, hi: int, mark: _Mark) -> None:
        if lo > hi or mark is _Mark.SHOWN:
            return
        why = _WHY[mark]
        if gaps and gaps[-1].why is why and gaps[-1].last == lo - 1:
            gaps[-1] = Gap(gaps[-1].first, hi, why)
        else:
            gaps.append(Gap(lo, hi, why))

    def fill_read(lo: int, hi: int) -> None:
        add(lo, min(hi, covers), covered)
        add(max(lo, covers + 1), min(hi, read_from - 1), unread_mark)
        add(max(lo, covers + 1, read_from), hi, _Mark.BUDGET)

    def fill(lo: int, hi: int) -> None:
        for e_lo, e_hi in erased:
            if e_hi < lo:
                continue
            if e_lo > hi:
                break
            fill_read(lo, e_lo - 1)
            add(max(lo, e_lo), min(hi, e_hi), _Mark.ERASED)
            lo = e_hi + 1
        fill_read(lo, hi)

    cursor = 1
    for seq in sorted(s for s in marks if s <= last):
        fill(cursor, seq - 1)
        add(seq, seq, marks[seq])
        cursor = seq + 1
    fill(cursor, last)
    return gaps


class Inputs(msgspec.Struct, frozen=True):
    """Everything the bounded reads returned: :func:`compose_view` is a pure function of it."""

    session: str
    agent: str
    admission: Admission
    budget: int
    config: FollowupConfig
    run: Run | None
    """The newest ended run of the agent with a request (None: no previous request)."""
    request: Row | None
    """Its exact request row."""
    compaction: Row | None
    notes: tuple[Note, ...]
    tail: tuple[Row, ...]
    """The newest contiguous rows after the compaction's coverage, oldest first."""
    tail_whole: bool
    """The tail reaches back to the coverage: no row after it was left unread."""
    tail_stop: int | None
    """The newest seq the tail left unread (None when whole)."""
    tail_cap: int
    """The stored-byte cap the tail was read with."""
    probe: tuple[Row, ...]
    """Rows between the coverage and a request that lies before the tail (at most PROBE_ROWS)."""
    tail_capped: bool = False
    """The tail read stopped at its row cap (not its byte cap): the rows before it were left
    unread whatever the budget (gaps there are ``read_cap``)."""
    tail_last: int | None = None
    """The session's last seq the tail read began at (None: not known): seqs up to it that the
    reads spanned and did not find were erased."""


# -- the core: messages --------------------------------------------------------------------------


def media_limits(config: FollowupConfig) -> msgs.MediaLimits:
    return msgs.MediaLimits(
        config.media_max_bytes, config.tool_media_max_bytes, config.media_max_total_bytes
    )


def row_message(row: Row, media: msgs.MediaLimits) -> ViewMessage:
    """A stored message as the view carries it: unchanged (its stored size reused), or with
    media over a limit replaced (measured again)."""
    if row.media_bytes:
        message, modified = msgs.limit_media(row.body, media)
    else:
        message, modified = row.body, False
    if modified:
        m = measure(message)
        size, media_bytes = m.text_bytes, m.media_bytes
    else:
        size, media_bytes = row.bytes, row.media_bytes
    return ViewMessage(
        role=str(message.get("role")),
        actor=row.actor,
        origin=row.seq,
        copied=False,
        synthetic=False,
        message=message,
        bytes=size,
        modified=modified,
        media_bytes=media_bytes,
        sources=row.sources,
    )


def _synthetic(message: dict[str, Any]) -> ViewMessage:
    return ViewMessage(
        role=str(message["role"]),
        actor=SYNTHETIC_ACTOR,
        origin=None,
        copied=False,
        synthetic=True,
        message=message,
        bytes=measure(message).text_bytes,
    )


def request_message(
    run: Run, req: Row, admission: Admission, media: msgs.MediaLimits, *, timestamp: int
) -> ViewMessage:
    """The previous request as the view carries it: the row itself, or, when the requester is
    not admitted to its sources, the stand-in in its place (docs/contracts.md#the-follow-up-view):
    synthetic, carrying no
    sources, since it shows nothing of the row but its seq, run and actor."""
    if admission.admits(req.sources):
        return row_message(req, media)
    return _synthetic(msgs.request_stand_in(req.seq, run.id, req.actor, timestamp=timestamp))


def protected(
    agent: str, comp: Row | None, covers: int, notes: Sequence[Note], *, timestamp: int
) -> list[ViewMessage]:
    """The quoted summary (of an admitted compaction) and the notes: reserved first."""
    top: list[ViewMessage] = []
    if comp is not None:
        summary = comp.body.get("summary")
        top.append(
            _synthetic(
                msgs.checkpoint_message(
                    summary if isinstance(summary, str) else "",
                    seq=comp.seq,
                    run=comp.run,
                    covers_to=covers,
                    continuation=bool(comp.body.get("continuation")),
                    timestamp=timestamp,
                )
            )
        )
        # Reserved with the summary: the anchors' message, naming them all as left out; the
        # anchors themselves fill what the rows chosen leave (:func:`quote_anchors`).
        anchors = msgs.anchor_items(comp.body)
        if anchors:
            top.append(
                _synthetic(
                    msgs.anchors_message((), seq=comp.seq, timestamp=timestamp, omitted=anchors)
                )
            )
    if notes:
        top.append(_synthetic(msgs.notes_message(agent, notes, timestamp=timestamp)))
    return top


def protected_refusal(size: int, budget: int, what: str = "") -> Refusal:
    return Refusal(
        RefusalReason.PROTECTED_CONTEXT_OVER_BUDGET,
        f"the previous request, notes and checkpoint summary{what} take {size} bytes, over the "
        f"budget of {budget}; raise [followup] budget_bytes or trim the notes",
    )


# -- the core: units and plans -------------------------------------------------------------------


class _Frame(msgspec.Struct, frozen=True):
    """What the core knows once the reads are done, before choosing rows."""

    budget: int
    admission: Admission
    last: int
    covers: int
    covered: _Mark
    marks: dict[int, _Mark]
    """Fixed marks: the compaction row."""
    probe_marks: dict[int, _Mark]
    """Rows between the coverage and the request (used only when the request is placed first)."""
    probe_notices: dict[int, ViewMessage]
    """The notices of the admitted receipts among them, by seq: a receipt marked shown there is
    shown as its notice, as in any unit the view carries (never dropped without a word)."""
    top: list[ViewMessage]
    top_bytes: int
    request_vm: ViewMessage | None
    request_seq: int | None
    request_withheld: bool
    """The requester may not read the request: ``request_vm`` is its stand-in."""
    media: msgs.MediaLimits
    """Media state after the request's own (the request's media are counted first)."""
    notice_max: int
    timestamp: int
    withheld_calls: frozenset[str]
    whole: bool
    unread: tuple[int, _Mark]
    """The tail's first seq, and why the rows after the coverage and before it are omitted."""
    erased: tuple[tuple[int, int], ...] = ()
    """Ranges of seqs the reads spanned and found missing (erased), sorted."""

    @property
    def floor(self) -> int:
        """Rows after it may follow a request placed first."""
        return max(self.covers, self.request_seq or 0)


class _Plan(msgspec.Struct, frozen=True):
    """One unit of the view (a message, or a batch of calls with its results), evaluated."""

    first: int
    items: list[ViewMessage]
    marks: dict[int, _Mark]
    sources: frozenset[str]
    cost: int
    media_used: int
    opening: bool
    """A usable boundary: it opens with an admitted user message carrying text."""
    edges: tuple[_Mark, _Mark]
    """The marks of its first and last rows: omitted runs that meet across units share a
    notice."""


def split_units(rows: Sequence[Row]) -> list[list[Row]]:
    """Split the tail into units the view takes whole: a message with tool calls together with
    the results (and prompt-state rows) that follow it, or any single other row."""
    units: list[list[Row]] = []
    i = 0
    while i < len(rows):
        unit = [rows[i]]
        i += 1
        if _calls(unit[0]):
            while i < len(rows) and (_is_result(rows[i]) or not _is_content(rows[i])):
                unit.append(rows[i])
                i += 1
            # Rows that are not history at the end belong to what follows, not the batch.
            while len(unit) > 1 and not _is_content(unit[-1]):
                i -= 1
                unit.pop()
        units.append(unit)
    return units


def plan_unit(f: _Frame, unit: Sequence[Row], media: msgs.MediaLimits) -> _Plan:
    """What one unit adds to the view: its messages, the answers to calls it leaves without a
    result, notices for its receipts, its marks and its cost (notices for omitted rows inside
    it included, at their largest)."""
    items: list[ViewMessage] = []
    after: list[ViewMessage] = []  # notices held until the batch's results are complete
    marks: dict[int, _Mark] = {}
    sources: set[str] = set()
    head = unit[0]
    calls = _calls(head)
    pending: dict[str, dict[str, Any]] = {}
    answered: set[str] = set()
    withheld_results: set[str] = set()
    head_withheld = False

    def carry(row: Row) -> None:
        # The request's message was made first, so its media were counted before the rest.
        vm = f.request_vm if row.seq == f.request_seq and f.request_vm else None
        items.append(vm or row_message(row, media))
        marks[row.seq] = _Mark.SHOWN
        sources.update(row.sources)

    for row in unit:
        if row.seq == f.request_seq and f.request_withheld and f.request_vm is not None:
            items.append(f.request_vm)  # the stand-in: it carries none of the row's sources
            marks[row.seq] = _Mark.SHOWN
            continue
        admitted = f.admission.admits(row.sources)
        if not _is_content(row):
            marks[row.seq] = _Mark.SHOWN if admitted else _Mark.WITHHELD
            if admitted and row.kind is RowKind.RECEIPT:
                after.append(_synthetic(msgs.receipt_notice(row.body, timestamp=f.timestamp)))
        elif row is head and calls:
            if admitted:
                carry(row)
                pending = {str(c["id"]): c for c in calls}
            else:
                marks[row.seq] = _Mark.WITHHELD
                head_withheld = True
        elif _is_result(row):
            cid = row.body.get("toolCallId")
            if head_withheld:
                marks[row.seq] = _Mark.WITHHELD
            elif isinstance(cid, str) and cid in pending and cid not in answered:
                if admitted:
                    carry(row)
                    answered.add(cid)
                else:
                    marks[row.seq] = _Mark.WITHHELD
                    withheld_results.add(cid)
            else:
                # A result whose call the view does not carry.
                withheld = isinstance(cid, str) and cid in f.withheld_calls
                marks[row.seq] = _Mark.WITHHELD if withheld else _Mark.BUDGET
        elif admitted:
            carry(row)
        else:
            marks[row.seq] = _Mark.WITHHELD

    for cid, call in pending.items():
        if cid not in answered:
            result = msgs.unknown_result(
                call, withheld=cid in withheld_results, timestamp=f.timestamp
            )
            items.append(_synthetic(result))
    items.extend(after)
    # Each run of omitted rows inside the unit may need a notice of its own (upper bound:
    # runs that meet a neighbouring gap merge with it).
    runs = 0
    previous: _Mark | None = None
    for row in unit:
        mark = marks[row.seq]
        if mark is not _Mark.SHOWN and mark is not previous:
            runs += 1
        previous = mark
    cost = sum(m.bytes for m in items) + runs * f.notice_max
    edges = (marks[head.seq], marks[unit[-1].seq])
    opening = (
        len(unit) == 1
        and request_problem(head) is None
        and marks[head.seq] is _Mark.SHOWN
        and head.seq > f.covers
    )
    return _Plan(head.seq, items, marks, frozenset(sources), cost, media.used, opening, edges)


def take_newest(
    f: _Frame,
    units: Sequence[Sequence[Row]],
    running: int,
    media_used: int,
    skips: int = 0,
    newer: _Plan | None = None,
) -> list[_Plan]:
    """The newest units while they fit the budget after ``running`` bytes: contiguous, except
    that up to ``skips`` units that alone take more than the space left, while that space is
    over a twentieth of the budget, are passed over (each then needs a notice of its own).
    ``newer`` is the chosen unit right after ``units``, when there is one."""
    taken: list[_Plan] = []
    adjacent = newer is not None
    for unit in reversed(units):
        media = f.media.copy()
        media.used = media_used
        plan = plan_unit(f, unit, media)
        cost = plan.cost
        joins = taken[-1].edges[0] if taken else newer.edges[0] if newer else None
        if adjacent and plan.edges[1] is not _Mark.SHOWN and plan.edges[1] is joins:
            cost -= f.notice_max  # its last omitted run joins the newer unit's first
        if running + cost > f.budget:
            if skips > 0 and f.budget - running >= f.budget // 20:
                skips -= 1
                running += f.notice_max
                adjacent = False
                continue
            break
        running += cost
        media_used = plan.media_used
        taken.append(plan)
        adjacent = True
    taken.reverse()
    return taken


def assemble(
    f: _Frame, plans: Sequence[_Plan], request_first: bool
) -> tuple[list[ViewMessage], list[Gap]]:
    """The view's messages in the order the model sees them, and its gaps: protected context,
    then history in seq order with a notice where each gap begins."""
    marks = dict(f.marks)
    if request_first and f.request_seq is not None:
        marks.update(f.probe_marks)
        marks[f.request_seq] = _Mark.SHOWN
    for plan in plans:
        marks.update(plan.marks)
    gaps = gaps_of(f.last, f.covers, f.covered, marks, f.unread, f.erased)
    entries: list[tuple[int, int, list[ViewMessage]]] = []
    for gap in gaps:
        notice = msgs.gap_notice(gap.first, gap.last, gap.why, timestamp=f.timestamp)
        entries.append((gap.first, 0, [_synthetic(notice)]))
    if request_first and f.request_vm is not None and f.request_seq is not None:
        entries.append((f.request_seq, 1, [f.request_vm]))
        entries.extend((seq, 1, [notice]) for seq, notice in f.probe_notices.items())
    for plan in plans:
        entries.append((plan.first, 1, plan.items))
    entries.sort(key=lambda e: (e[0], e[1]))
    history = [m for _, _, group in entries for m in group]
    return [*f.top, *history], gaps


def _size(messages: Sequence[ViewMessage]) -> int:
    return sum(m.bytes for m in messages)


# -- the core: choosing rows ---------------------------------------------------------------------


def frame(inp: Inputs) -> _Frame | Refusal:
    """Protected context at its final timestamp, the marks that do not depend on the rows chosen,
    and the largest notice; a refusal when the protected context does not fit."""
    comp, req, admission = inp.compaction, inp.request, inp.admission
    covers = coverage(comp)
    comp_ok = comp is not None and admission.admits(comp.sources)
    # Synthetic messages carry the newest timestamp the reads saw: deterministic, and in order
    # with the history they sit in.
    stamps = [_timestamp(row.body) for row in inp.tail if row.kind is RowKind.MESSAGE]
    if req is not None:
        stamps.append(_timestamp(req.body))
    timestamp = max(stamps, default=0)
    top = protected(inp.agent, comp if comp_ok else None, covers, inp.notes, timestamp=timestamp)
    media = media_limits(inp.config)
    request_vm = None
    if req is not None and inp.run is not None:
        request_vm = request_message(inp.run, req, admission, media, timestamp=timestamp)
    top_bytes = _size(top)
    reserved = top_bytes + (request_vm.bytes if request_vm else 0)
    if reserved > inp.budget:
        return protected_refusal(reserved, inp.budget)
    r = req.seq if req is not None else None
    last = inp.tail[-1].seq if inp.tail else (inp.tail_stop or covers)
    last = max(last, covers, r or 0, comp.seq if comp is not None else 0, inp.tail_last or 0)
    marks: dict[int, _Mark] = {}
    if comp is not None:
        marks[comp.seq] = _Mark.SHOWN if comp_ok else _Mark.WITHHELD
    probe_marks: dict[int, _Mark] = {}
    probe_notices: dict[int, ViewMessage] = {}
    if r is not None and 0 < r - 1 - covers <= PROBE_ROWS:
        between = inp.probe or tuple(row for row in inp.tail if covers < row.seq < r)
        for row in between:
            if not admission.admits(row.sources):
                probe_marks[row.seq] = _Mark.WITHHELD
            elif not _is_content(row):
                probe_marks[row.seq] = _Mark.SHOWN
                if row.kind is RowKind.RECEIPT:
                    notice = msgs.receipt_notice(row.body, timestamp=timestamp)
                    probe_notices[row.seq] = _synthetic(notice)
    notice_max = max(msgs.gap_notice_bound(last, why, timestamp=timestamp) for why in GapWhy)
    return _Frame(
        budget=inp.budget,
        admission=admission,
        last=last,
        covers=covers,
        covered=_Mark.SHOWN if comp_ok else _Mark.WITHHELD,
        marks=marks,
        probe_marks=probe_marks,
        probe_notices=probe_notices,
        top=top,
        top_bytes=top_bytes,
        request_vm=request_vm,
        request_seq=r,
        request_withheld=req is not None and not admission.admits(req.sources),
        media=media,
        notice_max=notice_max,
        timestamp=timestamp,
        withheld_calls=frozenset(
            str(c["id"])
            for row in inp.tail
            if not admission.admits(row.sources)
            for c in _calls(row)
        ),
        whole=inp.tail_whole,
        unread=(
            inp.tail[0].seq if inp.tail else last + 1,
            _Mark.READ_CAP if inp.tail_capped else _Mark.BUDGET,
        ),
        erased=erased_ranges(inp, covers),
    )


def erased_ranges(inp: Inputs, covers: int) -> tuple[tuple[int, int], ...]:
    """The seqs the reads spanned and did not find: erased
    (docs/operations.md#erasure-and-retention). The tail spans from
    the row it stopped at (or the coverage) to the session's last seq; the probe, the seqs
    between the coverage and a request before the tail. Unread seqs are not guessed at: they
    keep the reason they were not read for."""
    if inp.tail_last is None:
        return ()
    found = {row.seq for row in inp.tail}
    spans = [((inp.tail_stop if inp.tail_stop is not None else covers) + 1, inp.tail_last)]
    r = inp.request.seq if inp.request is not None else None
    first = inp.tail[0].seq if inp.tail else spans[0][0]
    if r is not None and r < first and 0 < r - 1 - covers <= PROBE_ROWS:
        spans.append((covers + 1, r - 1))  # read whole by the probe (build.read_inputs)
        found.update(row.seq for row in inp.probe)
    if r is not None:
        found.add(r)
    if inp.compaction is not None:
        found.add(inp.compaction.seq)
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        # Bounded by the reads: the tail spans at most its row cap of seqs (holes count
        # toward the cap), the probe PROBE_ROWS; a run of missing seqs is walked in one step.
        present = sorted(s for s in found if lo <= s <= hi)
        cursor = lo
        for s in [*present, hi + 1]:
            if s > cursor:
                out.append((cursor, s - 1))
            cursor = max(cursor, s + 1)
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(out):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _lead_notices(f: _Frame, floor: int, fixed_marks: Mapping[int, _Mark]) -> int:
    """Notices reserved for the gaps at or below ``floor`` (exact) and the one between it and the
    chosen rows: split in two by the compaction row when it lies there, in three when that row
    is withheld."""
    fixed = gaps_of(
        floor,
        f.covers,
        f.covered,
        {s: m for s, m in fixed_marks.items() if s <= floor},
        f.unread,
        f.erased,
    )
    lead = 1
    comp_marks = [s for s in f.marks if s > floor]
    if comp_marks:
        lead = 3 if f.marks[comp_marks[0]] is _Mark.WITHHELD else 2
    return len(fixed) + lead


def _whole_tail(f: _Frame, units: Sequence[Sequence[Row]]) -> list[_Plan] | None:
    """Everything after the coverage, when the tail reaches it and all of it fits exactly. The
    window's estimate reserves notices for gaps before it, which this window never needs: it
    must not keep a view that fits as it stands from being used so."""
    if not f.whole:
        return None
    plans = _plan_back(f, units, f.media.used)
    return plans if _size(assemble(f, plans, False)[0]) <= f.budget else None


def _plan_back(
    f: _Frame, units: Sequence[Sequence[Row]], media_used: int, *, to_opening: bool = False
) -> list[_Plan]:
    """Plans of ``units``, made newest first (as media are counted) and returned oldest first;
    with ``to_opening``, only back to the newest unit that opens an exchange."""
    plans: list[_Plan] = []
    for unit in reversed(units):
        media = f.media.copy()
        media.used = media_used
        plan = plan_unit(f, unit, media)
        media_used = plan.media_used
        plans.insert(0, plan)
        if to_opening and plan.opening:
            break
    return plans


def _reach_opening(
    f: _Frame, units: Sequence[Sequence[Row]], plans: Sequence[_Plan]
) -> list[_Plan] | None:
    """``plans`` (the estimate's newest units, without an opening) taken back to the nearest
    opening before them, when that whole exchange fits exactly: the estimate's reserve for the
    notices before the window is an upper bound, and must not keep the window from an exchange
    that fits. None when no opening was read before them, or the exchange does not fit."""
    older = [u for u in units if not plans or u[0].seq < plans[0].first]
    media_used = plans[0].media_used if plans else f.media.used
    more = _plan_back(f, older, media_used, to_opening=True)
    if not more or not more[0].opening:
        return None
    grown = [*more, *plans]
    return grown if _size(assemble(f, grown, False)[0]) <= f.budget else None


def reuse_window(f: _Frame, units: Sequence[Sequence[Row]], skips: int = 0) -> list[_Plan] | None:
    """Ordinary reuse: the newest units that fit the budget the protected context leaves, opened
    at a usable boundary (or at the coverage when all of it fits); None without an opening.
    Checked exactly, then grown by whole exchanges while they fit. With ``skips``, units too
    large for the space left may be passed over (see :func:`take_newest`)."""
    if not f.whole and not any(len(u) == 1 and request_problem(u[0]) is None for u in units):
        return None  # no user message with text anywhere in reach: no opening
    every = _whole_tail(f, units)
    if every is not None:
        return every
    running = f.top_bytes + _lead_notices(f, f.covers, f.marks) * f.notice_max
    plans = take_newest(f, units, running, f.media.used, skips)
    if not (f.whole and len(plans) == len(units)):
        start = next((i for i, p in enumerate(plans) if p.opening), None)
        if start is None:
            reached = _reach_opening(f, units, plans)
            if reached is None:
                return None
            plans = reached
        else:
            plans = plans[start:]
    # The reserve is an upper bound: drop the oldest exchange while over...
    while plans and _size(assemble(f, plans, False)[0]) > f.budget:
        nxt = next((i for i, p in enumerate(plans) if i > 0 and p.opening), len(plans))
        plans = plans[nxt:]
    # ...and take older exchanges whole while they fit, each checked exactly. Growth ends only
    # at an exchange that does not fit (invariant 5), not after a number of tries. The estimate
    # falls short by each notice's difference from the largest, which adds up over many units:
    # after EXACT_TRIES exchanges that fit, the older units are estimated again from the exact
    # size (one notice in reserve), and the exchanges that reaches are checked at once.
    older = [u for u in units if plans and u[0].seq < plans[0].first]
    tries = 0
    while older and plans:
        if tries == EXACT_TRIES:
            tries = 0
            exact = _size(assemble(f, plans, False)[0])
            media_used = plans[0].media_used
            estimated = take_newest(f, older, exact + f.notice_max, media_used, newer=plans[0])
            at = next((i for i, p in enumerate(estimated) if p.opening), None)
            if at is not None:
                grown = [*estimated[at:], *plans]
                if _size(assemble(f, grown, False)[0]) <= f.budget:
                    older = older[: len(older) - (len(estimated) - at)]
                    plans = grown
                    continue
        tries += 1
        media_used = plans[0].media_used
        more: list[_Plan] = []
        while older:
            media = f.media.copy()
            media.used = media_used
            plan = plan_unit(f, older[-1], media)
            media_used = plan.media_used
            more.insert(0, plan)
            older.pop()
            if plan.opening:
                break
        if not more[0].opening and not (f.whole and not older):
            break  # no opening before the window, and rows before these were never read
        grown = [*more, *plans]
        if _size(assemble(f, grown, False)[0]) > f.budget:
            break
        plans = grown
    return _take_back(f, units, plans) if skips and plans else plans


def _take_back(f: _Frame, units: Sequence[Sequence[Row]], plans: list[_Plan]) -> list[_Plan]:
    """The window with the units it passed over on the estimate taken back where they fit
    exactly, newest first: a unit is passed over only when it does not fit the space left, and
    the estimate (a notice at its largest for each omitted run) is an upper bound. A run of
    passed units is tried whole (it then needs no notice), then unit by unit."""
    chosen = {p.first for p in plans}
    runs: list[list[Sequence[Row]]] = []
    after_chosen = True
    for unit in units:
        if unit[0].seq <= plans[0].first or unit[0].seq in chosen:
            after_chosen = True
            continue
        if after_chosen:
            runs.append([])
        runs[-1].append(unit)
        after_chosen = False
    for passed in reversed(runs):
        singly = [[u] for u in reversed(passed)] if len(passed) > 1 else []
        for attempt in [passed, *singly]:
            wanted = chosen | {u[0].seq for u in attempt}
            grown = _plan_back(f, [u for u in units if u[0].seq in wanted], f.media.used)
            if _size(assemble(f, grown, False)[0]) <= f.budget:
                chosen, plans = wanted, grown
                if attempt is passed:
                    break
    return plans


def _fit(
    f: _Frame, units: Sequence[Sequence[Row]], after: Sequence[_Plan], placed: bool, reserve: int
) -> list[_Plan]:
    """The newest of ``units`` (all older than ``after``) that fit with ``after``: estimated
    with ``reserve`` bytes beyond the exact size of ``after``, checked exactly (dropping the
    oldest while over), then grown unit by unit while they fit. Growth ends only at a unit
    that does not fit (or when none are left): after :data:`EXACT_TRIES` units that all fit,
    the rest is estimated again from the exact size, with one notice in reserve (the gap
    before the units taken changes), so that a loose first reserve never ends it."""
    plans: list[_Plan] = []
    older = list(units)
    media_used = after[0].media_used if after else f.media.used
    while older:
        chosen = [*plans, *after]
        running = _size(assemble(f, chosen, placed)[0]) + reserve
        newer = plans[0] if plans else None  # contiguous with ``older``; ``after`` may not be
        more = take_newest(f, older, running, media_used, newer=newer)
        while more and _size(assemble(f, [*more, *chosen], placed)[0]) > f.budget:
            more = more[1:]
        if more:
            older = older[: len(older) - len(more)]
            media_used = more[0].media_used
            plans = [*more, *plans]
        for _ in range(EXACT_TRIES):
            if not older:
                return plans
            media = f.media.copy()
            media.used = media_used
            plan = plan_unit(f, older[-1], media)
            if _size(assemble(f, [plan, *plans, *after], placed)[0]) > f.budget:
                return plans
            older.pop()
            media_used = plan.media_used
            plans = [plan, *plans]
        reserve = f.notice_max
    return plans


def request_first(f: _Frame, units: Sequence[Sequence[Row]]) -> tuple[list[_Plan], bool]:
    """The request placed first, followed by the newest units after it that fit. A unit that
    alone takes more than the space left, while that space is over a twentieth of the budget, is
    left out (its own named gap; at most :data:`MAX_SKIPS` of them) and older units fill on.
    Also whether the rows read ran out while such space was left."""
    placed = f.request_seq is not None
    fixed_marks = {**f.marks, **f.probe_marks}
    reserve = _lead_notices(f, f.floor, fixed_marks) * f.notice_max
    plans = _fit(f, units, [], placed, reserve)
    older = list(units[: len(units) - len(plans)])
    for _ in range(MAX_SKIPS):
        if len(older) < 2 or f.budget - _size(assemble(f, plans, placed)[0]) < f.budget // 20:
            break
        older.pop()  # the unit that does not fit: named, not carried
        more = _fit(f, older, plans, placed, f.notice_max)
        plans = [*more, *plans]
        older = older[: len(older) - len(more)]
    roomy = f.budget - _size(assemble(f, plans, placed)[0]) >= f.budget // 20
    return plans, roomy and len(older) < 2


def choose(f: _Frame, units: Sequence[Sequence[Row]]) -> tuple[list[_Plan], bool, bool]:
    """The rows of the view (invariant 5); whether the request is placed first; whether rows
    not read could still fill it (a unit too large for the space left was the last one read)."""
    r = f.request_seq

    def holds(window: list[_Plan] | None) -> bool:
        return window is not None and (r is None or any(p.first == r for p in window))

    window = reuse_window(f, units)
    if holds(window):
        assert window is not None
        return window, False, False
    if r is not None:
        # The window, passing over units too large for the space left: the request stays in
        # place among its neighbours (copied, since the view is no longer contiguous).
        window = reuse_window(f, units, MAX_SKIPS)
        if holds(window):
            assert window is not None
            return window, False, False
    after = [u for u in units if u[0].seq > f.floor]
    plans, starved = request_first(f, after)
    return plans, r is not None, starved


def compose_view(inp: Inputs, request_text: str | None) -> tuple[FollowupView | Refusal, bool]:
    """The view, and whether more of the tail could fill it: its newest rows after a request
    placed first (or without an opening) stopped at a unit too large for a space left over a
    twentieth of the budget, with rows before it unread."""
    f = frame(inp)
    if isinstance(f, Refusal):
        return f, False
    # The smallest honest view: protected context and the notices naming everything else.
    minimal = _size(assemble(f, [], f.request_seq is not None)[0])
    if minimal > f.budget:
        refusal = protected_refusal(
            minimal, f.budget, " with the notices naming what they leave out"
        )
        return refusal, False
    plans, placed, starved = choose(f, split_units(inp.tail))
    messages, gaps = assemble(f, plans, placed)
    messages, quoted = quote_anchors(inp, f, messages)
    view = finish(inp, f, messages, gaps, plans, request_text, quoted)
    return view, starved and not inp.tail_whole


def quote_anchors(
    inp: Inputs, f: _Frame, messages: list[ViewMessage]
) -> tuple[list[ViewMessage], tuple[list[dict[str, Any]], int]]:
    """The checkpoint's anchors, newest first, as many as fit the room the protected context and
    the rows chosen leave: they never push out a row. The anchors' message was reserved naming
    them all as left out; it grows while the view stays within the budget. Also the anchors
    quoted and the number left out."""
    at = next(
        (
            i
            for i, m in enumerate(messages[: len(f.top)])  # the protected context leads
            if m.message.get("customType") == msgs.ANCHORS_TYPE
        ),
        None,
    )
    comp = inp.compaction
    if at is None or comp is None:
        return messages, ([], 0)
    items = msgs.anchor_items(comp.body)
    room = f.budget - _size(messages) + messages[at].bytes

    def quoted(k: int) -> ViewMessage:
        message = msgs.anchors_message(
            items[:k], seq=comp.seq, timestamp=f.timestamp, omitted=items[k:]
        )
        return _synthetic(message)

    best, lo, hi = messages[at], 1, len(items)
    k_best = 0
    while lo <= hi:  # the largest k that fits (sizes grow with k)
        mid = (lo + hi) // 2
        vm = quoted(mid)
        if vm.bytes <= room:
            best, k_best, lo = vm, mid, mid + 1
        else:
            hi = mid - 1
    out = list(messages)
    out[at] = best
    return out, (items[:k_best], len(items) - k_best)


def finish(
    inp: Inputs,
    f: _Frame,
    messages: list[ViewMessage],
    gaps: list[Gap],
    plans: Sequence[_Plan],
    request_text: str | None,
    quoted: tuple[list[dict[str, Any]], int] = ([], 0),
) -> FollowupView:
    """The view record: reuse only when true (invariant 7), sources, the current request."""
    previous: PreviousRequest | None = None
    reused = False
    run, req_row = inp.run, inp.request
    if run is not None and req_row is not None:
        r = req_row.seq
        contiguous = f.covers < r and all(g.last < r for g in gaps)
        changed = any(m.modified for m in messages)
        # A stand-in is not the stored row: the view is not the stored rows as they stand.
        reused = contiguous and not changed and not f.request_withheld
        previous = PreviousRequest(
            seq=r,
            run=run.id,
            actor=req_row.actor,
            mode=RequestMode.REUSED if reused else RequestMode.COPIED,
            withheld=f.request_withheld,
        )
    if not reused:
        messages = [m if m.synthetic else msgspec.structs.replace(m, copied=True) for m in messages]
    comp = inp.compaction if f.covered is _Mark.SHOWN else None
    sources: set[str] = set()
    if comp is not None:
        sources.update(comp.sources)
    if req_row is not None and not f.request_withheld:
        sources.update(req_row.sources)
    for note in inp.notes:
        sources.update(note.sources)
    for plan in plans:
        sources.update(plan.sources)
    checkpoint = None
    if comp is not None:
        anchored = [
            m for m in messages[: len(f.top)] if m.message.get("customType") == msgs.ANCHORS_TYPE
        ]
        checkpoint = Checkpoint(
            seq=comp.seq,
            bytes=f.top[0].bytes,
            run=comp.run,
            covers_to=f.covers,
            continuation=bool(comp.body.get("continuation")),
            anchors=tuple(quoted[0]) if anchored else (),
            anchors_bytes=sum(m.bytes for m in anchored),
            anchors_omitted=quoted[1] if anchored else 0,
            anchors_left_out=msgs.anchors_left_out(msgs.anchor_items(comp.body)[len(quoted[0]) :])
            if anchored
            else None,
        )
    current = None
    if request_text is not None:
        message = {
            "role": "user",
            "content": [{"type": "text", "text": request_text}],
            "timestamp": f.timestamp,
        }
        current = ViewMessage(
            role="user",
            actor=inp.admission.actor or "user",
            origin=None,
            copied=False,
            synthetic=False,
            message=message,
            bytes=measure(message).text_bytes,
        )
    return FollowupView(
        session=inp.session,
        agent=inp.agent,
        actor=inp.admission.actor,
        budget=inp.budget,
        bytes=_size(messages),
        checkpoint=checkpoint,
        previous_request=previous,
        messages=tuple(messages),
        gaps=tuple(gaps),
        sources=tuple(sorted(sources)),
        request=current,
        media_bytes=sum(m.media_bytes for m in messages),
    )
