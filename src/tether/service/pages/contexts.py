"""The context object of each page (:mod:`tether.service.page_context`), built from bounded
ledger reads with the API's admission: a page of rows by seq, the runs those rows belong to, the
live ones; the follow-up view exactly as the next run would be given it."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import HTTPException, status

from tether.errors import RecallError
from tether.followup import Refusal, build_view
from tether.followup.messages import ANCHORS_TYPE, CHECKPOINT_TYPE, NOTES_TYPE
from tether.harness.turn import recorded_decision
from tether.ledger import Ledger, Row, RowKind, Run, RunStatus
from tether.recall import MAX_HITS, search
from tether.sandbox.limits import limits_text
from tether.service.api import known_agent, sees_session, session_or_404
from tether.service.auth import Caller
from tether.service.page_context import (
    BudgetPart,
    IndexPage,
    NextPage,
    RunHeader,
    SearchPage,
    SessionLine,
    TimelinePage,
)
from tether.service.pages.display import message_display, row_display
from tether.service.state import ServiceState
from tether.usage import usage_text

__all__ = [
    "PAGE_ROWS",
    "answer_row",
    "index_context",
    "next_context",
    "run_header",
    "run_place",
    "search_context",
    "timeline_context",
]

PAGE_ROWS = 200
"""Rows on one timeline page: a page reads this many rows by seq, never the transcript."""
SESSIONS_SHOWN = 200


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    return round((b - a).total_seconds(), 2)


def answer_row(ledger: Ledger, run: Run) -> Row | None:
    """The run's last assistant message row (what its answer was mirrored from), read from the
    run's end backwards: the same row as :func:`tether.service.api.answer_row`, which reads the
    run from its start."""
    before = 2**62
    while True:
        page = ledger.run_rows_before(run.id, before, limit=ANSWER_PAGE)
        for row in page:
            if row.kind is RowKind.MESSAGE and row.role == "assistant":
                return row
        if len(page) < ANSWER_PAGE:
            return None
        before = page[-1].seq


ANSWER_PAGE = 32


def run_header(ledger: Ledger, run: Run, who: Caller) -> RunHeader:
    """A run's line on the timeline. Its details only where the API's ``GET /v1/runs/{run}``
    shows them: that refuses a caller not admitted to the run's answer row."""
    request = run.extra.get("request") or {}
    decided = recorded_decision(run.extra)
    withheld = False
    if run.extra.get("answer") is not None:
        row = answer_row(ledger, run)
        withheld = row is not None and not who.admission.admits(row.sources)
    return RunHeader(
        run=run.id,
        agent=run.agent,
        status=run.status.value,
        started=run.started,
        ended=run.ended,
        duration_s=_seconds(run.started, run.ended),
        actor=None if withheld else request.get("actor"),
        stop_reason=None if withheld else run.extra.get("stop_reason"),
        checkpoint=None if withheld else run.extra.get("checkpoint"),
        checkpoint_decision=None if withheld or decided is None else decided[0],
        checkpoint_reason=None if withheld or decided is None else decided[1],
        error=None if withheld else run.extra.get("error"),
        limits_hit=None if withheld else limits_text(run.extra),
        usage=None if withheld else usage_text(run.extra),
        details_withheld=withheld,
    )


def run_place(ledger: Ledger, session: str, run: str, who: Caller) -> str:
    """Where a run's link goes: the page of ``session`` whose first row is the run's first (its
    header leads it), also for a run a fork inherits; a run with no row yet is listed at the
    end of the newest page."""
    session_or_404(ledger, session, who)
    found = ledger.run(run)
    first = ledger.run_first_seq(run) if found is not None else None
    here = f"/sessions/{quote(session, safe='')}"
    if first is not None:
        row = ledger.row(session, first)
        if row is not None and row.run == run:  # in this session's view, a fork's too
            return f"{here}?after={first - 1}#run-{run}"
    if found is not None and found.session == session:
        return f"{here}#run-{run}"
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run!r} in session {session!r}")


def index_context(st: ServiceState, who: Caller) -> IndexPage:
    lines = []
    for session, last_seq, counts in st.ledger.session_overview(limit=SESSIONS_SHOWN):
        if not sees_session(st.ledger, session.id, who):
            continue
        if session.refusing:
            state = "refusing"
        elif counts.get(RunStatus.RUNNING):
            state = "running"
        elif counts.get(RunStatus.QUEUED):
            state = "queued"
        else:
            state = "idle"
        lines.append(
            SessionLine(
                session=session.id,
                created=session.created,
                state=state,
                refusing=session.refusing,
                last_seq=last_seq,
                runs=sum(counts.values()),
                counts={s.value: counts.get(s, 0) for s in RunStatus},
            )
        )
    return IndexPage(actor=who.actor, sessions=lines, shown_at_most=SESSIONS_SHOWN)


def timeline_context(
    st: ServiceState, session: str, who: Caller, after: int | None, limit: int
) -> TimelinePage:
    ledger = st.ledger
    session_or_404(ledger, session, who)
    found = ledger.get_session(session)
    last = ledger.last_seq(session)
    start = max(0, last - limit) if after is None else min(after, last)
    rows = ledger.rows_range(session, start + 1, start + limit, limit=limit)
    headers: dict[str, RunHeader] = {}
    groups: list[dict[str, Any]] = []
    for row in rows:
        shown = row_display(row, who)
        # A withheld row keeps its place in the open group: it names no run.
        run_id = shown.get("run") if shown["kind"] != "withheld" else None
        if run_id is not None and run_id not in headers:
            found_run = ledger.run(run_id)
            if found_run is not None:
                headers[run_id] = run_header(ledger, found_run, who)
        if not groups or (run_id is not None and groups[-1]["run"] != run_id):
            groups.append({"run": run_id, "rows": []})
        groups[-1]["rows"].append(shown)
    at_end = not rows or rows[-1].seq >= last
    live: list[str] = []
    pending: list[RunHeader] = []
    if at_end:
        for r in ledger.live_runs(session=session) + ledger.queued_runs(session, limit=20):
            live.append(r.id)
            if r.id not in headers:
                headers[r.id] = run_header(ledger, r, who)
                pending.append(headers[r.id])
    fork: dict[str, Any] | None = None
    if (link := ledger.fork_of(session)) is not None:
        parent, fork_seq = link
        # The row it forks at is the fork's too: its run is named as its row would be.
        at = ledger.row(session, fork_seq)
        run = at.run if at is not None and who.admission.admits(at.sources) else None
        fork = {"parent": parent, "seq": fork_seq, "run": run}
    first_shown = rows[0].seq if rows else None
    last_shown = rows[-1].seq if rows else start
    return TimelinePage(
        session=session,
        actor=who.actor,
        created=found.created,
        refusing=found.refusing,
        last_seq=last,
        after=start,
        limit=limit,
        first_shown=first_shown,
        last_shown=last_shown,
        older=max(0, start - limit) if start > 0 else None,
        newer=last_shown if last_shown < last else None,
        runs={k: v for k, v in headers.items()},
        groups=groups,
        pending=pending,
        live=live,
        agents=sorted(st.config.agents),
        fork=fork,
    )


def search_context(st: ServiceState, session: str, query: str, who: Caller) -> SearchPage:
    """The session searched as ``tether recall`` searches it, for the caller's actor with the
    service's grants: the admission every other page and API route applies."""
    session_or_404(st.ledger, session, who)
    query = query.strip()
    page = SearchPage(
        session=session,
        actor=who.actor,
        query=query,
        hits=[],
        withheld=[],
        withheld_more=False,
        at_most=MAX_HITS,
        error=None,
    )
    if not query:
        return page
    try:
        answer = search(st.ledger, session, query, actor=who.actor, grants=st.config.access.grants)
    except RecallError as exc:
        return dataclasses.replace(page, error=str(exc))
    found = answer.to_json()
    return dataclasses.replace(
        page,
        query=found["query"],
        hits=found["hits"],
        withheld=found["withheld"],
        withheld_more=bool(found.get("withheld_more")),
    )


def _part_of(message: dict[str, Any], origin: int | None, request_seq: int | None) -> str:
    if message.get("role") == "custom" and message.get("customType") in (
        CHECKPOINT_TYPE,
        ANCHORS_TYPE,  # reserved with the summary
    ):
        return "checkpoint"
    if message.get("role") == "custom" and message.get("customType") == NOTES_TYPE:
        return "notes"
    if origin is not None and origin == request_seq:
        return "previous_request"
    return "suffix"


PARTS = ("checkpoint", "previous_request", "notes", "suffix")


def next_context(st: ServiceState, session: str, agent: str, who: Caller) -> NextPage:
    session_or_404(st.ledger, session, who)
    known_agent(st, agent)
    view = build_view(
        st.ledger,
        session=session,
        agent=agent,
        actor=who.actor,
        config=st.config.followup,
        grants=st.config.access.grants,
    )
    agents = sorted(st.config.agents)
    if isinstance(view, Refusal):
        return NextPage(
            session=session,
            agent=agent,
            actor=who.actor,
            agents=agents,
            status="refused",
            refusal=view.to_json(),
            budget=st.config.followup.budget_bytes,
            bytes=0,
            parts=[],
            gaps=[],
            messages=[],
            checkpoint=None,
            anchors=None,
            previous_request=None,
            sources=[],
        )
    request_seq = view.previous_request.seq if view.previous_request else None
    sizes = dict.fromkeys(PARTS, 0)
    messages = []
    for m in view.messages:
        part = _part_of(m.message, m.origin, request_seq)
        sizes[part] += m.bytes
        messages.append(
            {
                "part": part,
                "origin": m.origin,
                "actor": m.actor,
                "copied": m.copied,
                "synthetic": m.synthetic,
                "bytes": m.bytes,
                "message": message_display(m.message),
            }
        )
    budget = view.budget
    parts = [
        BudgetPart(part=p, bytes=sizes[p], percent=round(100 * sizes[p] / budget, 2)) for p in PARTS
    ]
    free = max(0, budget - view.bytes)
    parts.append(BudgetPart(part="free", bytes=free, percent=round(100 * free / budget, 2)))
    return NextPage(
        session=session,
        agent=agent,
        actor=who.actor,
        agents=agents,
        status="ok",
        refusal=None,
        budget=budget,
        bytes=view.bytes,
        parts=parts,
        gaps=[g.to_json() for g in view.gaps],
        messages=messages,
        checkpoint=view.checkpoint.to_json() if view.checkpoint else None,
        anchors=view.checkpoint.anchors_json() if view.checkpoint else None,
        previous_request=view.previous_request.to_json() if view.previous_request else None,
        sources=list(view.sources),
    )
