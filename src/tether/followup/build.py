"""Building the follow-up view: what a new run of an agent on a session is given.

docs/contracts.md#the-follow-up-view, docs/contracts.md#byte-accounting,
docs/contracts.md#compaction-rows and invariants 1–9 and 18. This module is the imperative shell:
the
bounded reads (:func:`read_inputs`, through :class:`~tether.followup.reads.FollowupReads`) that
feed the functional core (:mod:`tether.followup.core`, pure steps: window, request placed first,
exact assembly). Nothing is written and no whole transcript is read:

* the session record (a refusing session refuses the view) and its opening row (admission);
* the newest ended run of the agent and its exact request row (``Run.request_seq``), by seq;
* the newest compaction row of either kind, by index, wherever it lies;
* the agent's notes, capped by count and bytes;
* a tail after the compaction's coverage, capped in stored bytes by what the notes and summary
  leave of the budget; read again (at most :data:`TAIL_READS` reads, never past twice the budget)
  when rows that cost the view nothing (prompt state, receipts, the compaction row, withheld
  rows) took part of that cap;
* when the request lies before the tail, at most :data:`PROBE_ROWS` rows between the coverage and
  it, only to name that gap exactly (prompt-state rows there are not history; a receipt there
  is shown as its notice).

The previous request is **partial** (``incomplete_request``) when its run wrote rows but no
request row (``request_seq`` is null), or when the request row is not a user message carrying
text (a non-message row, another role, or no non-blank text). It **cannot be read**
(``source_unavailable``) when the row is missing, belongs to another run, a ledger read fails, or
the newest :data:`ENDED_RUNS_READ` ended runs of the agent all ended without writing anything (an
older request would lie beyond the bounded read). An ended run that wrote nothing at all (pi
never started) has no session record and is passed over. A request the requester is not
admitted to is no refusal: the view carries a stand-in in its place
(docs/contracts.md#the-follow-up-view), and a
checkpoint it is not admitted to becomes a ``withheld`` gap over its range. ``access_denied`` is
left for a requester who may not see the session at all: one not admitted to its opening row
(row 1), the rule the service applies to every route of a session.

When the tail read stops at its row cap (:data:`TAIL_MAX_ROWS`) rather than its byte cap, the
rows it left unread are named as ``read_cap`` gaps, not ``budget`` ones: a huge budget does not
make them fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from tether.access import Admission
from tether.config import FollowupConfig
from tether.errors import LedgerError, NotFound
from tether.followup.core import (
    PROBE_ROWS,
    Inputs,
    compose_view,
    coverage,
    idle_bytes,
    media_limits,
    protected,
    protected_refusal,
    request_message,
    request_problem,
)
from tether.followup.reads import FollowupReads
from tether.followup.view import FollowupView, Refusal, RefusalReason
from tether.ledger.models import Row, Run, TailRead

__all__ = [
    "ENDED_RUNS_READ",
    "PROBE_ROWS",
    "TAIL_MAX_ROWS",
    "TAIL_READS",
    "build_view",
    "previous_request",
    "read_inputs",
    "read_more",
    "read_tail",
]

ENDED_RUNS_READ = 32
"""How many ended runs are looked through when the newest one recorded no request."""
TAIL_MAX_ROWS = 20_000
"""Row cap of the tail read (the byte cap is the budget)."""
TAIL_READS = 3
"""Tail reads at most: a read is repeated, with a larger cap, when rows that cost the view
nothing took part of the cap (a run's prompt snapshot can be tens of kilobytes)."""


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
    admission = Admission(grants, actor)
    try:
        inputs = read_inputs(reads, session, agent, admission, limit, config)
    except NotFound:
        raise
    except LedgerError as exc:
        return Refusal(RefusalReason.SOURCE_UNAVAILABLE, f"reading the ledger failed: {exc}")
    if isinstance(inputs, Refusal):
        return inputs
    view, more = compose_view(inputs, request)
    if more:
        try:
            again = read_more(reads, inputs)
        except LedgerError as exc:
            return Refusal(RefusalReason.SOURCE_UNAVAILABLE, f"reading the ledger failed: {exc}")
        if again is not None:
            view, _ = compose_view(again, request)
    return view


# -- the shell: bounded reads --------------------------------------------------------------------


def read_inputs(
    reads: FollowupReads,
    session: str,
    agent: str,
    admission: Admission,
    budget: int,
    config: FollowupConfig,
) -> Inputs | Refusal:
    """The bounded reads of a view, in order; a refusal as soon as one is certain."""
    sess = reads.session(session)
    if sess is None:
        raise NotFound(f"no session {session!r}; `tether sessions` lists them")
    # An actor sees a session when it is admitted to its opening row (as the service decides):
    # checked first, so that nothing about a session it may not see is told, not even why the
    # session refuses prompts.
    opening = reads.row(session, 1)
    if opening is not None and not admission.admits(opening.sources):
        who = admission.actor or "a requester without an actor"
        return Refusal(
            RefusalReason.ACCESS_DENIED,
            f"{who} is not admitted to session {session}: its opening row carries sources "
            "outside the grants of that actor ([access.grants])",
        )
    if sess.refusing:
        return Refusal(
            RefusalReason.SESSION_REFUSING,
            f"session {session} refuses new prompts: {sess.refusing}; after checking it, clear "
            f"it with `tether session clear {session}`",
        )
    found = previous_request(reads, session, agent)
    if isinstance(found, Refusal):
        return found
    run, req = found if found is not None else (None, None)
    comp = reads.latest_compaction(session)
    notes = tuple(
        # A note carries the sources its run was given: admission applies to it like a row.
        n
        for n in reads.notes(
            session, agent, max_count=config.notes_max_count, max_bytes=config.notes_max_bytes
        )
        if admission.admits(n.sources)
    )
    covers = coverage(comp)
    admitted_comp = comp if comp is not None and admission.admits(comp.sources) else None
    top = protected(agent, admitted_comp, covers, notes, timestamp=0)
    request_bytes = 0
    if run is not None and req is not None:
        request_bytes = request_message(
            run, req, admission, media_limits(config), timestamp=0
        ).bytes
    reserved = sum(m.bytes for m in top) + request_bytes
    if reserved > budget:
        return protected_refusal(reserved, budget)
    # The compaction row lies after its coverage, in the tail's way, but is quoted at the top.
    cap = budget - sum(m.bytes for m in top) + (comp.bytes if comp is not None else 0)
    tail, cap = read_tail(reads, session, covers, cap, budget, admission)
    probe: list[Row] = []
    r = req.seq if req is not None else None
    first = tail.rows[0].seq if tail.rows else (tail.stop_seq or covers) + 1
    if r is not None and r < first and 0 < r - 1 - covers <= PROBE_ROWS:
        probe = reads.rows_range(session, covers + 1, r - 1, limit=PROBE_ROWS)
    return Inputs(
        session=session,
        agent=agent,
        admission=admission,
        budget=budget,
        config=config,
        run=run,
        request=req,
        compaction=comp,
        notes=notes,
        tail=tuple(tail.rows),
        tail_whole=tail.stop_seq is None,
        tail_stop=tail.stop_seq,
        tail_cap=cap,
        probe=tuple(probe),
        tail_capped=_row_capped(tail),
        tail_last=tail.last_seq,
    )


def _row_capped(tail: TailRead) -> bool:
    """Whether the tail read stopped at its row cap, with rows before it left unread."""
    return tail.stop_seq is not None and len(tail.rows) >= TAIL_MAX_ROWS


def read_tail(
    reads: FollowupReads, session: str, after: int, cap: int, budget: int, admission: Admission
) -> tuple[TailRead, int]:
    """The tail after ``after`` capped at ``cap`` stored bytes; read again while rows that cost
    the view nothing (prompt snapshots, withheld rows) took part of the cap: first with the cap
    scaled so that the rest would fill it, last at the bound, twice the budget."""
    bound = max(cap, 2 * budget)
    tail = reads.tail(session, cap, after=after, max_rows=TAIL_MAX_ROWS)
    current = cap
    for attempt in range(1, TAIL_READS):
        if tail.stop_seq is None or len(tail.rows) >= TAIL_MAX_ROWS:
            break
        idle = idle_bytes(tail.rows, admission)
        used = tail.bytes - idle
        if idle <= 0 or used >= cap - budget // 20:
            break  # what the view can use of this read already fills the cap
        wanted = bound
        if attempt < TAIL_READS - 1 and used > 0:
            wanted = min(bound, cap * tail.bytes // used + 1)
        if wanted <= current:
            break
        current = wanted
        tail = reads.tail(session, current, after=after, max_rows=TAIL_MAX_ROWS)
    return tail, current


def read_more(reads: FollowupReads, inp: Inputs) -> Inputs | None:
    """The tail read again at its bound (twice the budget), for a view whose newest rows after
    the request stopped at a unit too large for the space left; None when it was read there."""
    bound = max(inp.tail_cap, 2 * inp.budget)
    if inp.tail_whole or len(inp.tail) >= TAIL_MAX_ROWS or inp.tail_cap >= bound:
        return None
    after = coverage(inp.compaction)
    tail = reads.tail(inp.session, bound, after=after, max_rows=TAIL_MAX_ROWS)
    return msgspec.structs.replace(
        inp,
        tail=tuple(tail.rows),
        tail_whole=tail.stop_seq is None,
        tail_stop=tail.stop_seq,
        tail_cap=bound,
        tail_capped=_row_capped(tail),
        tail_last=tail.last_seq,
    )


def previous_request(
    reads: FollowupReads, session: str, agent: str
) -> Refusal | tuple[Run, Row] | None:
    """The newest ended run of the agent that recorded a request, and that request's row."""
    run = reads.last_ended_run(session, agent)
    if run is None:
        return None
    if run.request_seq is None:
        candidates = reads.ended_runs(session, agent, limit=ENDED_RUNS_READ)
        chosen: Run | None = None
        for cand in candidates:
            if cand.request_seq is not None:
                chosen = cand
                break
            if reads.run_first_seq(cand.id) is not None:
                return Refusal(
                    RefusalReason.INCOMPLETE_REQUEST,
                    f"run {cand.id} of agent {agent} ended ({cand.status.value}) after writing "
                    "rows, but recorded no request row; inspect it with "
                    f"`tether log --session {session}`",
                )
        if chosen is None:
            if len(candidates) >= ENDED_RUNS_READ:
                return Refusal(
                    RefusalReason.SOURCE_UNAVAILABLE,
                    f"the newest {ENDED_RUNS_READ} ended runs of agent {agent} wrote nothing; "
                    "the previous request lies beyond the bounded read",
                )
            return None
        run = chosen
    seq = run.request_seq
    assert seq is not None  # chosen above for having one
    row = reads.row(session, seq)
    return _check_request(run, seq, row)


def _check_request(run: Run, seq: int, row: Row | None) -> Refusal | tuple[Run, Row]:
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
    problem = request_problem(row)
    if problem is not None:
        return Refusal(
            RefusalReason.INCOMPLETE_REQUEST,
            f"the request of run {run.id} is incomplete: {problem}",
        )
    # A request the requester may not read is not refused here: the view carries a stand-in in
    # its place (docs/contracts.md#the-follow-up-view; core.request_message).
    return run, row
