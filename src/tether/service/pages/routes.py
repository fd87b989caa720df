"""The pages and their JSON twins (each returns its page's context object as is), and the two
fragments the live script fetches (rows after a seq, one run's header)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from tether.service.api import AgentName, RunId, SessionId, blocking, session_or_404
from tether.service.page_context import RunHeader
from tether.service.pages.assets import context_data, env, json_page, render
from tether.service.pages.contexts import (
    PAGE_ROWS,
    index_context,
    next_context,
    run_header,
    run_place,
    search_context,
    timeline_context,
)
from tether.service.pages.login import PageCaller, StateDep, logout_token

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

After = Annotated[int | None, Query(ge=0)]
Limit = Annotated[int, Query(ge=1, le=1000)]


def _query(after: int | None, limit: int) -> str:
    parts = ([f"after={after}"] if after is not None else []) + (
        [f"limit={limit}"] if limit != PAGE_ROWS else []
    )
    return ("?" + "&".join(parts)) if parts else ""


@router.get("/", response_class=HTMLResponse)
async def index(who: PageCaller, st: StateDep, request: Request) -> HTMLResponse:
    ctx = await blocking(index_context, st, who)
    return render(
        "index.html", ctx, json_url="/index.json", form_token=logout_token(request), paths=st.paths
    )


@router.get("/index.json")
async def index_json(who: PageCaller, st: StateDep) -> JSONResponse:
    return json_page(await blocking(index_context, st, who), paths=st.paths)


@router.get("/sessions/{session}.json")
async def timeline_json(
    session: SessionId, who: PageCaller, st: StateDep, after: After = None, limit: Limit = PAGE_ROWS
) -> JSONResponse:
    return json_page(
        await blocking(timeline_context, st, session, who, after, limit), paths=st.paths
    )


@router.get("/sessions/{session}/rows.html", response_class=HTMLResponse)
async def timeline_fragment(
    session: SessionId, who: PageCaller, st: StateDep, after: After = None, limit: Limit = PAGE_ROWS
) -> HTMLResponse:
    """The rows after a seq as the timeline renders them (the live script appends them)."""
    ctx = await blocking(timeline_context, st, session, who, after, limit)
    html = env().get_template("rows.html").render(ctx=context_data(ctx, st.paths))
    return HTMLResponse(html)


@router.get("/sessions/{session}/runs/{run}/head.html", response_class=HTMLResponse)
async def run_head_fragment(
    session: SessionId, run: RunId, who: PageCaller, st: StateDep
) -> HTMLResponse:
    """One run's header as the timeline renders it (the live script refreshes it at the end)."""

    def header() -> RunHeader:
        session_or_404(st.ledger, session, who)
        found = st.ledger.run(run)
        if found is None or found.session != session:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run!r} in session {session!r}")
        return run_header(st.ledger, found, who)

    head = await blocking(header)
    template = env().from_string('{% import "macros.html" as m %}{{ m.run_head(h, session) }}')
    return HTMLResponse(template.render(h=context_data(head, st.paths), session=session))


@router.get("/sessions/{session}/runs/{run}")
async def run_link(
    session: SessionId, run: RunId, who: PageCaller, st: StateDep
) -> RedirectResponse:
    """A run's link (its id wherever a page shows it): to its header on the session's page."""
    place = await blocking(run_place, st.ledger, session, run, who)
    return RedirectResponse(place, status_code=status.HTTP_303_SEE_OTHER)


@router.get("/sessions/{session}/next.json")
async def next_json(
    session: SessionId, agent: AgentName, who: PageCaller, st: StateDep
) -> JSONResponse:
    return json_page(await blocking(next_context, st, session, agent, who), paths=st.paths)


Words = Annotated[str, Query(max_length=1000)]


@router.get("/sessions/{session}/search.json")
async def search_json(
    session: SessionId, who: PageCaller, st: StateDep, q: Words = ""
) -> JSONResponse:
    return json_page(await blocking(search_context, st, session, q, who), paths=st.paths)


@router.get("/sessions/{session}/search", response_class=HTMLResponse)
async def search_page(
    session: SessionId, who: PageCaller, st: StateDep, request: Request, q: Words = ""
) -> HTMLResponse:
    """The session page's search box: recall's search, its hits linked to their rows."""
    ctx = await blocking(search_context, st, session, q, who)
    json_url = f"/sessions/{quote(session, safe='')}/search.json?q={quote(q, safe='')}"
    return render(
        "search.html", ctx, json_url=json_url, form_token=logout_token(request), paths=st.paths
    )


@dataclass(frozen=True)
class AgentPick:
    """``/next`` asked without ``?agent=``: the agents to choose from."""

    session: str
    agents: list[str]


@router.get("/sessions/{session}/next", response_class=HTMLResponse, response_model=None)
async def next_page(
    session: SessionId,
    who: PageCaller,
    st: StateDep,
    request: Request,
    agent: AgentName | None = None,
) -> HTMLResponse | RedirectResponse:
    if agent is None:  # which agent's next view: one configured is the answer, else a choice
        await blocking(session_or_404, st.ledger, session, who)
        agents = sorted(st.config.agents)
        here = f"/sessions/{quote(session, safe='')}/next"
        if len(agents) == 1:
            return RedirectResponse(f"{here}?agent={quote(agents[0], safe='')}", status_code=303)
        pick = AgentPick(session=session, agents=agents)
        return render("pick.html", pick, form_token=logout_token(request), paths=st.paths)
    ctx = await blocking(next_context, st, session, agent, who)
    json_url = f"/sessions/{quote(session, safe='')}/next.json?agent={quote(agent, safe='')}"
    return render(
        "next.html", ctx, json_url=json_url, form_token=logout_token(request), paths=st.paths
    )


@router.get("/sessions/{session}", response_class=HTMLResponse)
async def timeline(
    session: SessionId,
    who: PageCaller,
    st: StateDep,
    request: Request,
    after: After = None,
    limit: Limit = PAGE_ROWS,
) -> HTMLResponse:
    ctx = await blocking(timeline_context, st, session, who, after, limit)
    json_url = f"/sessions/{quote(session, safe='')}.json{_query(after, limit)}"
    return render(
        "session.html", ctx, json_url=json_url, form_token=logout_token(request), paths=st.paths
    )
