"""Pages for people (DESIGN §3.8): ``/`` (sessions), ``/sessions/{session}`` (the timeline,
``?after=SEQ`` pages on), ``/sessions/{session}/next?agent=A`` (the follow-up view for the caller).

Each page renders one context object (:mod:`tether.service.page_context`), and its JSON twin
(``/index.json``, ``/sessions/{session}.json``, ``/sessions/{session}/next.json``) returns that same
object, as Datasette does. Authentication is the API's: the bearer token, or the HttpOnly cookie
``POST /login`` sets with it; admission is the API's too (:func:`tether.service.api.row_json`,
``sees_session``, ``run_json``), so a page never shows what the actor could not read through the
API. Reads are bounded: a page of rows by seq, the runs those rows belong to, the live ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import asdict
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sse_starlette import EventSourceResponse, ServerSentEvent

from tether.access import Admission
from tether.followup import Refusal, build_view
from tether.followup.messages import ANCHORS_TYPE, CHECKPOINT_TYPE, NOTES_TYPE
from tether.ledger import Ledger, Row, RowKind, Run, RunStatus
from tether.service import stream
from tether.service.api import blocking, row_json, sees_session
from tether.service.auth import Caller, actor_for
from tether.service.page_context import (
    BudgetPart,
    IndexPage,
    LoginPage,
    NextPage,
    RunHeader,
    SessionLine,
    TimelinePage,
)
from tether.service.state import ServiceState, service_of

__all__ = ["COOKIE", "PAGE_ROWS", "router"]

COOKIE = "tether_token"
PAGE_ROWS = 200
"""Rows on one timeline page: a page reads this many rows by seq, never the transcript."""
SESSIONS_SHOWN = 200

HERE = Path(__file__).parent
STATIC = HERE / "static"

router = APIRouter(include_in_schema=False)


@cache
def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["static"] = static_url
    env.filters["tojson_compact"] = lambda v: json.dumps(v, ensure_ascii=False, indent=1)
    env.filters["q"] = lambda v: quote(str(v), safe="")
    return env


@cache
def static_url(name: str) -> str:
    """``/static/NAME?h=…``: the hash busts caches when the file changes (Datasette's way)."""
    digest = hashlib.sha256((STATIC / name).read_bytes()).hexdigest()[:12]
    return f"/static/{name}?h={digest}"


# -- authentication --------------------------------------------------------------------------------


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(COOKIE) or None


def page_caller(request: Request) -> Caller:
    """The API's caller, from ``Authorization: Bearer`` or the login cookie."""
    st = service_of(request.app)
    token = _token(request)
    actor = actor_for(st.config.service.tokens, token) if token else None
    if actor is None:
        raise _login_required(request)
    return Caller(actor=actor, admission=Admission(st.config.access.grants, actor))


PageCaller = Annotated[Caller, Depends(page_caller)]


def _state(request: Request) -> ServiceState:
    return service_of(request.app)


StateDep = Annotated[ServiceState, Depends(_state)]


def _login_required(request: Request) -> HTTPException:
    """A JSON twin or a stream answers 401; a page sends the browser to the login form (an
    HTTPException with a Location header: no handler of its own on the app)."""
    path = request.url.path
    if path.endswith((".json", ".html")) or path.startswith("/live/"):
        return HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "send Authorization: Bearer TOKEN, or log in at /login",
            headers={"WWW-Authenticate": 'Bearer realm="tether"'},
        )
    target = path + (f"?{request.url.query}" if request.url.query else "")
    return HTTPException(
        status.HTTP_303_SEE_OTHER,
        "log in first",
        headers={"Location": f"/login?next={quote(target, safe='')}"},
    )


def _safe_next(value: str | None) -> str:
    """Only a path on this site (no scheme, no host): a login never redirects elsewhere."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def _render(name: str, ctx: Any, *, json_url: str | None = None, code: int = 200) -> HTMLResponse:
    data = asdict(ctx)
    html = _env().get_template(name).render(ctx=data, json_url=json_url)
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}
    if json_url:
        headers["Link"] = f'<{json_url}>; rel="alternate"; type="application/json"'
    return HTMLResponse(html, status_code=code, headers=headers)


CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; frame-ancestors 'none'; form-action 'self'"
)
"""Scripts only from /static; inline styles only for the budget bar's widths."""


def _json(ctx: Any, code: int = 200) -> JSONResponse:
    return JSONResponse(asdict(ctx), status_code=code)


@router.get("/login")
async def login_form(next: str | None = None) -> HTMLResponse:
    return _render("login.html", LoginPage(next=_safe_next(next), error=None))


@router.post("/login")
async def login(request: Request, st: StateDep) -> Response:
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or ["/"])[0])
    if not token or actor_for(st.config.service.tokens, token) is None:
        page = LoginPage(next=target, error="unknown token: its SHA-256 is not in [service.tokens]")
        return _render("login.html", page, code=status.HTTP_401_UNAUTHORIZED)
    response = RedirectResponse(target, status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/login", status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/static/{name}")
async def static_file(name: str) -> FileResponse:
    path = STATIC / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no static file {name!r}")
    return FileResponse(path, headers={"Cache-Control": "public, max-age=86400"})


# -- rendering helpers -----------------------------------------------------------------------------


THUMBNAIL_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def _args_text(args: Any) -> str:
    """Tool-call arguments as JSON: one line when short, indented when long."""
    flat = json.dumps(args, ensure_ascii=False)
    return flat if len(flat) <= 100 else json.dumps(args, ensure_ascii=False, indent=1)


def _parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as display parts: text, thinking, tool_call, image, other."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return [] if content is None else [{"type": "other", "json": content}]
    out: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            out.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "thinking":
            out.append({"type": "thinking", "text": str(block.get("thinking", ""))})
        elif kind == "toolCall":
            args = block.get("arguments")
            out.append(
                {
                    "type": "tool_call",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": args if isinstance(args, str) else _args_text(args),
                }
            )
        elif kind == "image":
            data = block.get("data")
            mime = str(block.get("mimeType") or "image/png")
            # Only image types become data: URLs (never text/html or SVG with its scripts).
            shown = isinstance(data, str) and mime in THUMBNAIL_TYPES
            out.append(
                {
                    "type": "image",
                    "mime": mime,
                    "data": data if shown else None,
                    "size": len(data) if isinstance(data, str) else 0,
                }
            )
        else:
            out.append({"type": "other", "json": block})
    return out


def message_display(message: dict[str, Any]) -> dict[str, Any]:
    """A pi AgentMessage as the templates show it."""
    role = message.get("role")
    shown: dict[str, Any] = {"role": role, "parts": _parts(message.get("content"))}
    if role == "toolResult":
        shown["tool"] = {
            "name": message.get("toolName"),
            "call_id": message.get("toolCallId"),
            "is_error": bool(message.get("isError")),
        }
    elif role == "bashExecution":
        shown["parts"] = [
            {"type": "tool_call", "id": None, "name": "bash", "arguments": message.get("command")},
            {"type": "text", "text": str(message.get("output", ""))},
        ]
        shown["tool"] = {"name": "bash", "call_id": None, "is_error": message.get("exitCode") != 0}
    elif role == "custom":
        shown["custom_type"] = message.get("customType")
    elif role == "assistant":
        shown["stop_reason"] = message.get("stopReason")
    elif role == "system":
        # pi's opening system message: its prompt sections and tools, collapsed.
        rest = {k: v for k, v in message.items() if k not in ("role", "timestamp", "content")}
        shown["parts"] = [p for p in shown["parts"] if p.get("text", True)]
        if rest:
            shown["parts"].append({"type": "other", "json": {"type": "system prompt", **rest}})
    return shown


def row_display(row: Row, who: Caller) -> dict[str, Any]:
    """A row for the timeline: withheld rows carry only their seq (as the API names them)."""
    if row_json(row, who).get("withheld"):
        return {"seq": row.seq, "kind": "withheld"}
    out: dict[str, Any] = {
        "seq": row.seq,
        "run": row.run,
        "actor": row.actor,
        "kind": row.kind.value,
        "bytes": row.bytes,
        "media_bytes": row.media_bytes,
        "sources": list(row.sources),
    }
    if row.kind is RowKind.MESSAGE:
        out["message"] = message_display(row.body)
    elif row.kind is RowKind.COMPACTION:
        body = row.body
        out["compaction"] = {
            "kind": "continuation" if body.get("continuation") else "pi",
            "covers_to": row.covers_to,
            "summary": str(body.get("summary", "")),
            "tokens_before": body.get("tokens_before"),
        }
    else:
        out["receipt"] = {
            "kind": row.body.get("kind"),
            "reason": row.body.get("reason"),
            "run": row.body.get("run"),
        }
    return out


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
        error=None if withheld else run.extra.get("error"),
        details_withheld=withheld,
    )


def _session_or_error(ledger: Ledger, session: str, who: Caller) -> None:
    if ledger.session(session) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no session {session!r}")
    if not sees_session(ledger, session, who):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{who.actor} is not admitted to session {session!r} (its opening row's sources)",
        )


# -- contexts --------------------------------------------------------------------------------------


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
    _session_or_error(ledger, session, who)
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
    _session_or_error(st.ledger, session, who)
    try:
        st.config.agent(agent)
    except Exception as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, str(exc)) from None
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


# -- pages and their JSON twins --------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
async def index(who: PageCaller, st: StateDep) -> HTMLResponse:
    return _render("index.html", await blocking(index_context, st, who), json_url="/index.json")


@router.get("/index.json")
async def index_json(who: PageCaller, st: StateDep) -> JSONResponse:
    return _json(await blocking(index_context, st, who))


After = Annotated[int | None, Query(ge=0)]
Limit = Annotated[int, Query(ge=1, le=1000)]


def _query(after: int | None, limit: int) -> str:
    parts = ([f"after={after}"] if after is not None else []) + (
        [f"limit={limit}"] if limit != PAGE_ROWS else []
    )
    return ("?" + "&".join(parts)) if parts else ""


@router.get("/sessions/{session}.json")
async def timeline_json(
    session: str, who: PageCaller, st: StateDep, after: After = None, limit: Limit = PAGE_ROWS
) -> JSONResponse:
    return _json(await blocking(timeline_context, st, session, who, after, limit))


@router.get("/sessions/{session}/rows.html", response_class=HTMLResponse)
async def timeline_fragment(
    session: str, who: PageCaller, st: StateDep, after: After = None, limit: Limit = PAGE_ROWS
) -> HTMLResponse:
    """The rows after a seq as the timeline renders them (the live script appends them)."""
    ctx = await blocking(timeline_context, st, session, who, after, limit)
    html = _env().get_template("rows.html").render(ctx=asdict(ctx))
    return HTMLResponse(html)


@router.get("/sessions/{session}/runs/{run}/head.html", response_class=HTMLResponse)
async def run_head_fragment(session: str, run: str, who: PageCaller, st: StateDep) -> HTMLResponse:
    """One run's header as the timeline renders it (the live script refreshes it at the end)."""

    def header() -> RunHeader:
        _session_or_error(st.ledger, session, who)
        found = st.ledger.run(run)
        if found is None or found.session != session:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run!r} in session {session!r}")
        return run_header(st.ledger, found, who)

    head = await blocking(header)
    template = _env().from_string('{% import "macros.html" as m %}{{ m.run_head(h) }}')
    return HTMLResponse(template.render(h=asdict(head)))


@router.get("/sessions/{session}/next.json")
async def next_json(session: str, agent: str, who: PageCaller, st: StateDep) -> JSONResponse:
    return _json(await blocking(next_context, st, session, agent, who))


@router.get("/sessions/{session}/next", response_class=HTMLResponse)
async def next_page(session: str, agent: str, who: PageCaller, st: StateDep) -> HTMLResponse:
    ctx = await blocking(next_context, st, session, agent, who)
    json_url = f"/sessions/{quote(session, safe='')}/next.json?agent={quote(agent, safe='')}"
    return _render("next.html", ctx, json_url=json_url)


@router.get("/sessions/{session}", response_class=HTMLResponse)
async def timeline(
    session: str, who: PageCaller, st: StateDep, after: After = None, limit: Limit = PAGE_ROWS
) -> HTMLResponse:
    ctx = await blocking(timeline_context, st, session, who, after, limit)
    json_url = f"/sessions/{quote(session, safe='')}.json{_query(after, limit)}"
    return _render("session.html", ctx, json_url=json_url)


@router.get("/live/runs/{run}/events")
async def live_events(
    run: str,
    who: PageCaller,
    st: StateDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """The service's own event stream of a run (``GET /v1/runs/{run}/events``), reached with the
    login cookie: a browser's EventSource cannot send an Authorization header. Only the events
    that carry admission (status, row, checkpoint, end) pass: the pages render rows, not deltas,
    and a text delta is not checked against the sources of the row it will become."""
    response = await stream.run_events(run, who, st, last_event_id)
    return EventSourceResponse(_admitted_only(response.body_iterator), ping=15, send_timeout=30)


async def _admitted_only(events: AsyncIterable[Any]) -> AsyncIterator[Any]:
    try:
        async for event in events:
            if isinstance(event, ServerSentEvent) and event.event in LIVE_EVENTS:
                yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


LIVE_EVENTS = frozenset({"status", "row", "checkpoint", "end"})
