"""Building the follow-up view: what a new run of an agent on a session is given.

DESIGN §3.2, §3.3, §3.6 and invariants 1–9 and 18. A pure function of bounded reads
(:class:`~tether.followup.reads.FollowupReads`); it writes nothing and reads no whole transcript:

* the session record (a refusing session refuses the view);
* the newest ended run of the agent and its exact request row (``Run.request_seq``), by seq;
* the newest compaction row of either kind, by index, wherever it lies;
* the agent's notes, capped by count and bytes;
* a tail after ``max(request seq, compaction covers_to)`` capped by the budget in stored bytes;
* when the request lies after the compaction's coverage, at most :data:`PROBE_ROWS` rows between
  them, only to measure that gap exactly (prompt-state rows there are not history).

The previous request is **partial** (``incomplete_request``) when its run wrote rows but no
request row (``request_seq`` is null), or when the request row is not a user message carrying
text (a non-message row, another role, or no non-blank text). It **cannot be read**
(``source_unavailable``) when the row is missing, belongs to another run, a ledger read fails, or
the newest :data:`ENDED_RUNS_READ` ended runs of the agent all ended without writing anything (an
older request would lie beyond the bounded read). An ended run that wrote nothing at all (pi
never started) has no session record and is passed over.

Every seq of the session is accounted for: covered by the quoted checkpoint, the checkpoint row
itself, the previous request, carried as a message, prompt state or a receipt (not history: the
new run has its own prompt, and a receipt becomes a notice), or inside a named gap.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tether.access import Admission
from tether.config import FollowupConfig
from tether.errors import LedgerError, NotFound
from tether.followup import messages as msgs
from tether.followup.reads import FollowupReads
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
from tether.ledger.models import Row, RowKind, Run
from tether.sizes import measure

__all__ = ["ENDED_RUNS_READ", "PROBE_ROWS", "TAIL_MAX_ROWS", "build_view"]

ENDED_RUNS_READ = 32
"""How many ended runs are looked through when the newest one recorded no request."""
PROBE_ROWS = 16
"""Rows read between the checkpoint's coverage and the request to name that gap exactly."""
TAIL_MAX_ROWS = 20_000
"""Row cap of the tail read (the byte cap is the budget)."""
EXACT_TRIES = 4
"""Units tried beyond the estimate, each checked by assembling the view exactly."""

# Non-history rows: prompt state and receipts. The new run has its own prompt; a receipt becomes
# a notice; the newest compaction is quoted at the top.
_PROMPT_ROLES = frozenset({"system"})


class _Mark(enum.Enum):
    SHOWN = "shown"
    """Represented: carried, summarized, quoted, or not history."""
    BUDGET = "budget"
    WITHHELD = "withheld"


_WHY = {_Mark.BUDGET: GapWhy.BUDGET, _Mark.WITHHELD: GapWhy.WITHHELD}


def build_view(
    reads: FollowupReads,
    *,
    session: str,
    agent: str,
    actor: str | None = None,
    request: str | None = None,
    budget: int | None = None,
    config: FollowupConfig = FollowupConfig(),  # noqa: B008 - a frozen struct
    grants: Mapping[str, Sequence[str]] | None = None,
) -> FollowupView | Refusal:
    """The view a new run of ``agent`` on ``session`` would be given, or why it is refused.

    ``actor`` is the requester; admission applies its ``grants`` (actor → source patterns, as in
    ``[access.grants]``; no grants admit only rows that carry no source). ``request`` is the new
    request's text: it rides after the view, outside the budget. ``budget`` overrides
    ``config.budget_bytes``. A missing session raises :class:`~tether.errors.NotFound`; a ledger
    read failure is a ``source_unavailable`` refusal.
    """
    limit = config.budget_bytes if budget is None else budget
    if limit <= 0:
        raise ValueError(f"the budget must be a positive number of bytes, not {limit}")
    builder = _Builder(reads, session, agent, Admission(grants, actor), limit, config)
    try:
        return builder.build(request)
    except NotFound:
        raise
    except LedgerError as exc:
        return Refusal(RefusalReason.SOURCE_UNAVAILABLE, f"reading the ledger failed: {exc}")


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


def _request_problem(row: Row) -> str | None:
    """Why a request row is partial, or None when it is a complete request."""
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


def gaps_of(last: int, covers: int, covered: _Mark, marks: Mapping[int, _Mark]) -> list[Gap]:
    """The omitted ranges of seqs ``1..last``: seqs up to ``covers`` default to ``covered``, the
    rest to BUDGET, and ``marks`` override single seqs. Neighbours with the same reason merge."""
    gaps: list[Gap] = []

    def add(lo: int, hi: int, mark: _Mark) -> None:
        if lo > hi or mark is _Mark.SHOWN:
            return
        why = _WHY[mark]
        if gaps and gaps[-1].why is why and gaps[-1].last == lo - 1:
            gaps[-1] = Gap(gaps[-1].first, hi, why)
        else:
            gaps.append(Gap(lo, hi, why))

    def fill(lo: int, hi: int) -> None:
        add(lo, min(hi, covers), covered)
        add(max(lo, covers + 1), hi, _Mark.BUDGET)

    cursor = 1
    for seq in sorted(s for s in marks if s <= last):
        fill(cursor, seq - 1)
        add(seq, seq, marks[seq])
        cursor = seq + 1
    fill(cursor, last)
    return gaps


@dataclass
class _Plan:
    """One unit of the suffix (a message, or a batch of calls with its results), evaluated."""

    first: int
    items: list[ViewMessage]
    marks: dict[int, _Mark]
    sources: set[str]
    cost: int
    media_used: int


@dataclass
class _Context:
    """What the builder knows once the bounded reads are done."""

    last: int
    covers: int
    covered: _Mark
    marks: dict[int, _Mark]
    top: list[ViewMessage]
    request_vm: ViewMessage | None
    request_seq: int | None
    notice_max: int
    timestamp: int
    withheld_calls: set[str] = field(default_factory=set)


class _Builder:
    def __init__(
        self,
        reads: FollowupReads,
        session: str,
        agent: str,
        admission: Admission,
        budget: int,
        config: FollowupConfig,
    ) -> None:
        self.reads = reads
        self.session = session
        self.agent = agent
        self.admission = admission
        self.budget = budget
        self.config = config

    # -- the previous request ------------------------------------------------------------------

    def _previous_request(self) -> Refusal | tuple[Run, Row] | None:
        run = self.reads.last_ended_run(self.session, self.agent)
        if run is None:
            return None
        if run.request_seq is None:
            candidates = self.reads.ended_runs(self.session, self.agent, limit=ENDED_RUNS_READ)
            chosen: Run | None = None
            for cand in candidates:
                if cand.request_seq is not None:
                    chosen = cand
                    break
                if self.reads.run_first_seq(cand.id) is not None:
                    return Refusal(
                        RefusalReason.INCOMPLETE_REQUEST,
                        f"run {cand.id} of agent {self.agent} ended ({cand.status.value}) after "
                        "writing rows, but recorded no request row; inspect it with "
                        f"`tether log --session {self.session}`",
                    )
            if chosen is None:
                if len(candidates) >= ENDED_RUNS_READ:
                    return Refusal(
                        RefusalReason.SOURCE_UNAVAILABLE,
                        f"the newest {ENDED_RUNS_READ} ended runs of agent {self.agent} wrote "
                        "nothing; the previous request lies beyond the bounded read",
                    )
                return None
            run = chosen
        seq = run.request_seq
        assert seq is not None  # chosen above for having one
        row = self.reads.row(self.session, seq)
        if row is None:
            return Refusal(
                RefusalReason.SOURCE_UNAVAILABLE,
                f"the request of run {run.id} (row {seq}) cannot be read from the ledger",
            )
        if row.run != run.id:
            return Refusal(
                RefusalReason.SOURCE_UNAVAILABLE,
                f"row {seq}, recorded as the request of run {run.id}, belongs to run {row.run}",
            )
        problem = _request_problem(row)
        if problem is not None:
            return Refusal(
                RefusalReason.INCOMPLETE_REQUEST,
                f"the request of run {run.id} is incomplete: {problem}",
            )
        if not self.admission.admits(row.sources):
            who = self.admission.actor or "a requester without an actor"
            return Refusal(
                RefusalReason.ACCESS_DENIED,
                f"{who} is not admitted to the previous request (row {seq} of run {run.id})",
            )
        return run, row

    # -- messages ------------------------------------------------------------------------------

    def _row_message(self, row: Row, media: msgs.MediaLimits) -> ViewMessage:
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

    @staticmethod
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

    # -- the suffix ----------------------------------------------------------------------------

    def _units(self, rows: Sequence[Row]) -> list[list[Row]]:
        """Split the tail into units the suffix takes whole: a message with tool calls together
        with the results (and prompt-state rows) that follow it, or any single other row."""
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

    def _plan(self, unit: Sequence[Row], media: msgs.MediaLimits, ctx: _Context) -> _Plan:
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

        for row in unit:
            admitted = self.admission.admits(row.sources)
            if not _is_content(row):
                marks[row.seq] = _Mark.SHOWN if admitted else _Mark.WITHHELD
                if admitted and row.kind is RowKind.RECEIPT:
                    after.append(
                        self._synthetic(msgs.receipt_notice(row.body, timestamp=ctx.timestamp))
                    )
            elif row is head and calls:
                if admitted:
                    items.append(self._row_message(row, media))
                    marks[row.seq] = _Mark.SHOWN
                    sources.update(row.sources)
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
                        items.append(self._row_message(row, media))
                        marks[row.seq] = _Mark.SHOWN
                        sources.update(row.sources)
                        answered.add(cid)
                    else:
                        marks[row.seq] = _Mark.WITHHELD
                        withheld_results.add(cid)
                else:
                    # A result whose call the view does not carry.
                    withheld = isinstance(cid, str) and cid in ctx.withheld_calls
                    marks[row.seq] = _Mark.WITHHELD if withheld else _Mark.BUDGET
            elif admitted:
                items.append(self._row_message(row, media))
                marks[row.seq] = _Mark.SHOWN
                sources.update(row.sources)
            else:
                marks[row.seq] = _Mark.WITHHELD

        for cid, call in pending.items():
            if cid not in answered:
                result = msgs.unknown_result(
                    call, withheld=cid in withheld_results, timestamp=ctx.timestamp
                )
                items.append(self._synthetic(result))
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
        cost = sum(m.bytes for m in items) + runs * ctx.notice_max
        return _Plan(head.seq, items, marks, sources, cost, media.used)

    def _assemble(
        self, ctx: _Context, plans: Sequence[_Plan]
    ) -> tuple[list[ViewMessage], list[Gap]]:
        marks = dict(ctx.marks)
        for plan in plans:
            marks.update(plan.marks)
        gaps = gaps_of(ctx.last, ctx.covers, ctx.covered, marks)
        entries: list[tuple[int, int, list[ViewMessage]]] = []
        for gap in gaps:
            notice = msgs.gap_notice(gap.first, gap.last, gap.why, timestamp=ctx.timestamp)
            entries.append((gap.first, 0, [self._synthetic(notice)]))
        if ctx.request_vm is not None and ctx.request_seq is not None:
            entries.append((ctx.request_seq, 1, [ctx.request_vm]))
        for plan in plans:
            entries.append((plan.first, 1, plan.items))
        entries.sort(key=lambda e: (e[0], e[1]))
        history = [m for _, _, group in entries for m in group]
        return [*ctx.top, *history], gaps

    # -- the view ------------------------------------------------------------------------------

    def build(self, request_text: str | None) -> FollowupView | Refusal:
        reads, config = self.reads, self.config
        sess = reads.session(self.session)
        if sess is None:
            raise NotFound(f"no session {self.session!r}; `tether sessions` lists them")
        if sess.refusing:
            return Refusal(
                RefusalReason.SESSION_REFUSING,
                f"session {self.session} refuses new prompts: {sess.refusing}; after checking "
                f"it, clear it with `tether session clear {self.session}`",
            )
        found = self._previous_request()
        if isinstance(found, Refusal):
            return found
        run, req_row = found if found is not None else (None, None)
        comp = reads.latest_compaction(self.session)
        notes = reads.notes(
            self.session,
            self.agent,
            max_count=config.notes_max_count,
            max_bytes=config.notes_max_bytes,
        )

        comp_ok = comp is not None and self.admission.admits(comp.sources)
        covers = 0
        if comp is not None:
            raw = comp.covers_to
            covers = max(0, min(raw if raw is not None else 0, comp.seq - 1))
        r = req_row.seq if req_row is not None else None
        floor = max(covers, r or 0)

        media = msgs.MediaLimits(
            config.media_max_bytes, config.tool_media_max_bytes, config.media_max_total_bytes
        )
        request_vm = self._row_message(req_row, media) if req_row is not None else None

        def protected(timestamp: int) -> list[ViewMessage]:
            top: list[ViewMessage] = []
            if comp is not None and comp_ok:
                summary = comp.body.get("summary")
                top.append(
                    self._synthetic(
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
            if notes:
                top.append(
                    self._synthetic(msgs.notes_message(self.agent, notes, timestamp=timestamp))
                )
            return top

        def protected_refusal(size: int, what: str = "") -> Refusal:
            return Refusal(
                RefusalReason.PROTECTED_CONTEXT_OVER_BUDGET,
                f"the previous request, notes and checkpoint summary{what} take {size} bytes, "
                f"over the budget of {self.budget}; raise [followup] budget_bytes or trim the "
                "notes",
            )

        head = protected(0)
        reserved = sum(m.bytes for m in head) + (request_vm.bytes if request_vm else 0)
        if reserved > self.budget:
            return protected_refusal(reserved)

        extra = comp.bytes if comp is not None and comp.seq > floor else 0
        tail = reads.tail(
            self.session,
            self.budget - reserved + extra,
            after=floor,
            max_rows=TAIL_MAX_ROWS,
        )
        rows = tail.rows
        last = rows[-1].seq if rows else (tail.stop_seq or floor)
        last = max(last, floor, comp.seq if comp is not None else 0)

        # Synthetic messages carry the newest timestamp the reads saw: deterministic, and in
        # order with the history they sit in.
        stamps = [_timestamp(row.body) for row in rows if row.kind is RowKind.MESSAGE]
        if req_row is not None:
            stamps.append(_timestamp(req_row.body))
        timestamp = max(stamps, default=0)
        top = protected(timestamp)
        reserved = sum(m.bytes for m in top) + (request_vm.bytes if request_vm else 0)
        if reserved > self.budget:
            return protected_refusal(reserved)

        marks: dict[int, _Mark] = {}
        if comp is not None:
            marks[comp.seq] = _Mark.SHOWN if comp_ok else _Mark.WITHHELD
        if r is not None:
            marks[r] = _Mark.SHOWN
            if 0 < r - 1 - covers <= PROBE_ROWS:
                for row in reads.rows_range(self.session, covers + 1, r - 1, limit=PROBE_ROWS):
                    if not self.admission.admits(row.sources):
                        marks[row.seq] = _Mark.WITHHELD
                    elif not _is_content(row):
                        marks[row.seq] = _Mark.SHOWN
        notice_max = max(
            measure(msgs.gap_notice(last, last, why, timestamp=timestamp)).text_bytes
            for why in GapWhy
        )
        ctx = _Context(
            last=last,
            covers=covers,
            covered=(_Mark.SHOWN if comp_ok else _Mark.WITHHELD),
            marks=marks,
            top=top,
            request_vm=request_vm,
            request_seq=r,
            notice_max=notice_max,
            timestamp=timestamp,
            withheld_calls={
                str(c["id"])
                for row in rows
                if not self.admission.admits(row.sources)
                for c in _calls(row)
            },
        )

        # The smallest honest view: protected context and the notices naming everything else.
        messages, gaps = self._assemble(ctx, [])
        minimal = sum(m.bytes for m in messages)
        if minimal > self.budget:
            return protected_refusal(minimal, " with the notices naming what they leave out")

        # The suffix, newest unit first, while it fits. Gaps at or below the floor are fixed;
        # between the floor and the suffix lies one more, split in two by the compaction row
        # when it lies there, in three when that row is withheld. Notices are reserved at their
        # largest size (every seq in them as wide as the last).
        fixed = gaps_of(floor, covers, ctx.covered, {s: m for s, m in marks.items() if s <= floor})
        lead = 1
        if comp is not None and comp.seq > floor:
            lead = 2 if comp_ok else 3
        running = reserved + (len(fixed) + lead) * notice_max
        units = self._units(rows)
        plans: list[_Plan] = []
        while units:
            plan = self._plan(units[-1], media.copy(), ctx)
            if running + plan.cost > self.budget:
                break
            units.pop()
            running += plan.cost
            media.used = plan.media_used
            plans.insert(0, plan)
        messages, gaps = self._assemble(ctx, plans)
        # The reserves are upper bounds: check exactly, dropping the oldest unit while over (this
        # keeps invariant 1 whatever the estimate), or taking a few more while they fit.
        while sum(m.bytes for m in messages) > self.budget and plans:
            plans.pop(0)
            messages, gaps = self._assemble(ctx, plans)
        for _ in range(EXACT_TRIES):
            if not units:
                break
            plan = self._plan(units[-1], media.copy(), ctx)
            more, more_gaps = self._assemble(ctx, [plan, *plans])
            if sum(m.bytes for m in more) > self.budget:
                break
            units.pop()
            media.used = plan.media_used
            plans.insert(0, plan)
            messages, gaps = more, more_gaps

        return self._view(
            ctx, comp if comp_ok else None, run, req_row, messages, gaps, plans, request_text
        )

    def _view(
        self,
        ctx: _Context,
        comp: Row | None,
        run: Run | None,
        req_row: Row | None,
        messages: list[ViewMessage],
        gaps: list[Gap],
        plans: Sequence[_Plan],
        request_text: str | None,
    ) -> FollowupView:
        previous: PreviousRequest | None = None
        reused = False
        if run is not None and req_row is not None:
            r = req_row.seq
            contiguous = ctx.covers <= r and all(g.last < r for g in gaps)
            changed = any(m.modified for m in messages)
            reused = contiguous and not changed
            previous = PreviousRequest(
                seq=r,
                run=run.id,
                actor=req_row.actor,
                mode=RequestMode.REUSED if reused else RequestMode.COPIED,
            )
        if not reused:
            messages = [m if m.synthetic else replace(m, copied=True) for m in messages]
        sources: set[str] = set()
        if comp is not None:
            sources.update(comp.sources)
        if req_row is not None:
            sources.update(req_row.sources)
        for plan in plans:
            sources.update(plan.sources)
        checkpoint = None
        if comp is not None:
            top = ctx.top[0]
            checkpoint = Checkpoint(
                seq=comp.seq,
                bytes=top.bytes,
                run=comp.run,
                covers_to=ctx.covers,
                continuation=bool(comp.body.get("continuation")),
            )
        current = None
        if request_text is not None:
            message = {
                "role": "user",
                "content": [{"type": "text", "text": request_text}],
                "timestamp": ctx.timestamp,
            }
            current = ViewMessage(
                role="user",
                actor=self.admission.actor or "user",
                origin=None,
                copied=False,
                synthetic=False,
                message=message,
                bytes=measure(message).text_bytes,
            )
        return FollowupView(
            session=self.session,
            agent=self.agent,
            actor=self.admission.actor,
            budget=self.budget,
            bytes=sum(m.bytes for m in messages),
            checkpoint=checkpoint,
            previous_request=previous,
            messages=tuple(messages),
            gaps=tuple(gaps),
            sources=tuple(sorted(sources)),
            request=current,
            media_bytes=sum(m.media_bytes for m in messages),
        )
