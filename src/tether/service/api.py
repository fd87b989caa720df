"""The JSON API of docs/contracts.md#the-http-api (``/v1/…``). Every endpoint acts as the bearer
token's actor and
applies admission to what it reads: a row the caller is not admitted to is named (its seq), never
shown."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Annotated, Any, Literal

import anyio
import msgspec
from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tether import telemetry
from tether.admission import admit_request
from tether.errors import (
    AlreadyExists,
    ConfigError,
    NotFound,
    RecallError,
    SessionBusy,
    SessionRefusing,
    UsageError,
)
from tether.followup import Refusal, RefusalReason, Refused, build_view
from tether.harness.custody.erasing import DEFAULT_STOP_GRACE_S, erase_stopping
from tether.harness.relay import Deliver
from tether.harness.traces import KEY, queued_context
from tether.ids import id_problem
from tether.ledger import Ledger, Row, Run, RunStatus
from tether.ledger.jsonl import row_record
from tether.ledger.lifecycle import Selector, SelectorKind
from tether.pi.workspace import fork_workspace
from tether.recall import add_note
from tether.sandbox.limits import recorded_limits
from tether.service.answers import answer_row
from tether.service.attachments import ImageIn, digests, request_images
from tether.service.auth import Caller, caller
from tether.service.budgets import request_budget
from tether.service.limits import request_limits
from tether.service.paths import ServerPaths
from tether.service.state import ServiceState, service_of
from tether.service.tracing import server_span
from tether.threads import in_thread
from tether.usage import recorded_usage

__all__ = [
    "RequestIn",
    "RequestOut",
    "RunOut",
    "admit_and_enqueue",
    "answer_row",
    "blocking",
    "relay_request",
    "router",
    "row_json",
    "run_json",
]


UNPROCESSABLE = HTTPStatus.UNPROCESSABLE_ENTITY
"""422. Starlette's ``HTTP_422_UNPROCESSABLE_ENTITY`` warns (renamed ``…_CONTENT`` in 0.48, absent
before): the standard library's name works, silently, with every Starlette FastAPI accepts."""

router = APIRouter(prefix="/v1", tags=["v1"])
CallerDep = Annotated[Caller, Depends(caller)]


blocking = in_thread  # a ledger call (synchronous) in a worker thread


async def state(request: Request) -> ServiceState:
    """Async, as :func:`~tether.service.auth.caller`: not a thread hand-off per request."""
    return service_of(request.app)


StateDep = Annotated[ServiceState, Depends(state)]


# -- shapes ----------------------------------------------------------------------------------------


def _id(kind: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        problem = id_problem(value)
        if problem is not None:
            raise ValueError(f"{kind} id {problem}")
        return value

    return check


SessionId = Annotated[str, AfterValidator(_id("session"))]
"""A session id where it enters (path or body): checked before the ledger sees it (422)."""
RunId = Annotated[str, AfterValidator(_id("run"))]
AgentName = Annotated[str, AfterValidator(_id("agent"))]


class RequestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: AgentName
    text: str = Field(min_length=1)
    """The request; not blank."""
    request_id: Annotated[str, AfterValidator(_id("request"))] | None = Field(
        None, min_length=1, max_length=200
    )
    """The client's key, scoped to the session and the caller's actor: the same key again with
    the same agent and text returns the same answer and writes nothing; with another, 409."""
    deliver: Deliver = Deliver.QUEUE
    images: list[ImageIn] = Field(default_factory=list, max_length=64)  # service.attachments


class RequestOut(BaseModel):
    run: str
    status: Literal["queued", "delivered"]
    request_id: str | None
    trace_id: str | None = None
    """The trace the run's spans join (docs/operations.md#traces): the request's ``traceparent``
    continued,
    or a new trace; None when the service does not trace and no ``traceparent`` came."""


class RunOut(BaseModel):
    run: str
    session: str
    agent: str
    actor: str | None
    status: RunStatus
    answer: str | None
    checkpoint: str | None
    stop_reason: str | None
    error: str | None = None
    delivered_into: str | None = None
    limits_hit: list[dict[str, Any]] | None = None
    """The sandbox limits the run's tools hit (``extra.limits_hit``: limit, tool, seq,
    evidence); None when it hit none."""
    usage: dict[str, Any] | None = None
    """What its provider calls used, as pi reported them (``extra.usage``, tether.usage):
    ``{"model", "provider", "task": {calls, input, output, cache_read, cache_write,
    total_tokens, cost}, "checkpoint": {…}}``, the checkpoint's summary call apart; None
    before the run ended (or for a run ended before it was recorded)."""


class NoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: AgentName
    text: str = Field(min_length=1)


class EdgeRefusal(enum.StrEnum):
    """Why the API refuses a request that admission (``RefusalReason``) would not."""

    REQUEST_ID_CONFLICT = "request_id_conflict"
    """The ``request_id`` was used by the same actor on the session for another request."""


def refused(code: int, reason: str, detail: str) -> HTTPException:
    return HTTPException(code, {"status": "refused", "reason": reason, "detail": detail})


# -- helpers ---------------------------------------------------------------------------------------


def row_json(row: Row, caller: Caller, paths: ServerPaths | None = None) -> dict[str, Any]:
    """A row as the interchange format writes it (with ``paths``, the server's directories
    rewritten: tether.service.paths), or only its seq when the caller is not admitted to every
    source it carries."""
    if caller.admission.admits(row.sources):
        found = row_record(row)
        return paths.scrub(found) if paths is not None else found
    return {"type": "row", "session": row.session, "seq": row.seq, "withheld": True}


def run_json(ledger: Ledger, run: Run, caller: Caller) -> dict[str, Any]:
    """``GET /v1/runs/{run}``; 403 when the caller is not admitted to the run's answer."""
    request = run.extra.get("request") or {}
    answer = run.extra.get("answer")
    if answer is not None:
        row = answer_row(ledger, run)
        if row is not None and not caller.admission.admits(row.sources):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{caller.actor} is not admitted to the answer of run {run.id} "
                f"(row {row.seq} carries sources outside its grants)",
            )
    return RunOut(
        run=run.id,
        session=run.session,
        agent=run.agent,
        actor=request.get("actor"),
        status=run.status,
        answer=answer,
        checkpoint=run.extra.get("checkpoint"),
        stop_reason=run.extra.get("stop_reason"),
        error=run.extra.get("error"),
        delivered_into=run.extra.get("delivered_into"),
        limits_hit=[msgspec.to_builtins(hit) for hit in recorded_limits(run.extra)] or None,
        usage=found.to_json() if (found := recorded_usage(run.extra)) is not None else None,
    ).model_dump(mode="json")


def sees_session(ledger: Ledger, session: str, caller: Caller) -> bool:
    """A caller sees a session when it is admitted to its opening row (or it has none)."""
    first = ledger.row(session, 1)
    return first is None or caller.admission.admits(first.sources)


def session_or_404(ledger: Ledger, session: str, caller: Caller) -> None:
    if ledger.session(session) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no session {session!r}")
    if not sees_session(ledger, session, caller):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{caller.actor} is not admitted to session {session!r} (its opening row's sources)",
        )


def known_agent(st: ServiceState, agent: str) -> None:
    """422 for an agent this server does not configure. The message names the configured ones,
    never the configuration file (a path of the server's filesystem)."""
    if agent not in st.config.agents:
        known = ", ".join(sorted(st.config.agents)) or "none"
        raise HTTPException(
            UNPROCESSABLE,
            f"unknown agent {agent!r} (configured here: {known}); use one of them, or ask the "
            "server's operator to add it",
        )


def _admit_request(st: ServiceState, session: str, body: RequestIn, caller: Caller) -> None:
    """The request's admission, as ``tether run`` checks it: the request itself (not empty, at
    most ``[followup] request_max_bytes``), then the view its run would be given (when the
    session has history) must not be refused; nothing is written."""
    known_agent(st, body.agent)
    try:
        admit_request(body.text, st.config.followup)
    except (ConfigError, UsageError) as exc:
        raise HTTPException(UNPROCESSABLE, str(exc)) from None
    except Refused as exc:
        raise refused(status.HTTP_409_CONFLICT, exc.reason.value, exc.detail) from None
    found = st.ledger.session(session)
    if found is None:
        return
    if found.refusing:
        raise refused(
            status.HTTP_409_CONFLICT,
            "session_refusing",
            f"session {session!r} refuses new prompts: {found.refusing}; an operator clears it "
            f"with `tether session clear {session}`",
        )
    if st.ledger.last_seq(session) == 0:
        return
    view = build_view(
        st.ledger,
        session=session,
        agent=body.agent,
        actor=caller.actor,
        request=body.text,
        config=st.config.followup,
        grants=st.config.access.grants,
    )
    if isinstance(view, Refusal):
        code = (
            status.HTTP_403_FORBIDDEN
            if view.reason is RefusalReason.ACCESS_DENIED
            else status.HTTP_409_CONFLICT
        )
        raise refused(code, view.reason.value, view.detail)


def _answer(run: Run, request_id: str | None) -> RequestOut:
    into = run.extra.get("delivered_into")
    if into:
        return RequestOut(run=into, status="delivered", request_id=request_id)
    return RequestOut(run=run.id, status="queued", request_id=request_id)


# -- endpoints -------------------------------------------------------------------------------------


@router.post(
    "/sessions/{session}/requests",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RequestOut,
    summary="Queue a request on a session, or deliver it into its live run",
)
async def post_request(
    session: SessionId, body: RequestIn, who: CallerDep, st: StateDep, request: Request
) -> RequestOut:
    incoming = request.headers.get("traceparent")
    # Ended with the status answered, a refusal's too (tether.service.tracing).
    span = server_span(
        request,
        "/v1/sessions/{session}/requests",
        {"gen_ai.conversation.id": session, "gen_ai.agent.name": body.agent},
        parent=incoming,
    )
    answer = await _post_request(session, body, who, st, span.traceparent or incoming)
    span.set({"tether.run.id": answer.run, "tether.request.status": answer.status})
    if answer.trace_id is not None:  # a repeated request: its run's trace
        return answer
    return answer.model_copy(
        update={"trace_id": telemetry.trace_id_of(span.traceparent or incoming)}
    )


async def _post_request(
    session: str, body: RequestIn, who: Caller, st: ServiceState, traceparent: str | None
) -> RequestOut:
    # The trace the worker's run continues is written with the queued run: a worker woken
    # by another post may claim it the moment it is queued.
    traced = queued_context(traceparent)
    try:
        run, created = await blocking(admit_and_enqueue, st, session, body, who, traced)
    except SessionRefusing as exc:
        raise refused(status.HTTP_409_CONFLICT, "session_refusing", str(exc)) from None
    if not created:
        _same_request(run, session, body, who)
        kept = run.extra.get(KEY)
        first = telemetry.trace_id_of(kept.get("parent") if isinstance(kept, dict) else None)
        if first is not None:
            return _answer(run, body.request_id).model_copy(update={"trace_id": first})
    elif body.deliver is Deliver.QUEUE:
        st.queued()
    if not created or body.deliver is Deliver.QUEUE:
        return _answer(run, body.request_id)
    return await relay_request(st, run, body)


def admit_and_enqueue(
    st: ServiceState, session: str, body: RequestIn, who: Caller, traced: dict[str, Any]
) -> tuple[Run, bool]:
    """Admission, then the queued run (the service's requests, and a chat bridge's:
    docs/bridges.md): one thread hand-off for the two (each costs the event loop, which the
    service's runs share, more than the ledger's work)."""
    _admit_request(st, session, body, who)
    images = request_images(st.config, body.agent, body.deliver, body.images)  # 413/422
    return st.ledger.enqueue_run(
        session,
        body.agent,
        actor=who.actor,
        text=body.text,
        request_id=scoped_request_id(who.actor, body.request_id),
        extra={**traced, **images},
        limits=request_limits(st.config, who.actor, body.deliver),  # over one: 429 (limits.py)
        budget=request_budget(st.config, who.actor),  # over it: 429 (budgets.py)
    )


def scoped_request_id(actor: str, request_id: str | None) -> str | None:
    """The ledger's key of a client's ``request_id``: one actor's key never finds another's run.
    The ledger keys runs by (session, key); a JSON pair is one printable line, unambiguous
    whatever the actor and the id hold."""
    if request_id is None:
        return None
    return json.dumps([actor, request_id], ensure_ascii=False, separators=(",", ":"))


def _same_request(run: Run, session: str, body: RequestIn, who: Caller) -> None:
    """A retry must be the request it repeats: 409 naming what differs otherwise."""
    asked = run.extra.get("request") or {}
    differs = [
        name
        for name, theirs, mine in (
            ("agent", run.agent, body.agent),
            ("text", asked.get("text"), body.text),
            ("images", *digests(run, body.images)),
        )
        if theirs != mine
    ]
    if differs:
        raise refused(
            status.HTTP_409_CONFLICT,
            EdgeRefusal.REQUEST_ID_CONFLICT.value,
            f"request_id {body.request_id!r} was already used by {who.actor} on session "
            f"{session!r} for run {run.id}, with another {' and '.join(differs)}; send a new "
            "request_id for a new request, or the same request to learn its run",
        )


async def relay_request(st: ServiceState, run: Run, body: RequestIn) -> RequestOut:
    """Mark the queued run for delivery into the live run and wait (a little) for the worker
    holding that run to take it; otherwise it stays the session's next queued run."""
    marked = await blocking(st.ledger.update_queued_extra, run.id, {"deliver": body.deliver.value})
    st.queued(run.session)  # the live run's relay takes it now; or a worker claims it
    deadline = anyio.current_time() + st.config.service.relay_wait_s
    while marked:
        current = await blocking(st.ledger.get_run, run.id)
        if current.extra.get("delivered_into") or current.status is not RunStatus.QUEUED:
            return _answer(current, body.request_id)
        live = await blocking(st.ledger.live_runs, session=run.session)
        if not live or anyio.current_time() >= deadline:
            break
        await anyio.sleep(0.02)
    # Not taken in time: withdraw the mark, so it runs as the next queued run (the worker may
    # have taken it meanwhile: then it says so).
    await blocking(st.ledger.update_queued_extra, run.id, {"deliver": Deliver.QUEUE.value})
    return _answer(await blocking(st.ledger.get_run, run.id), body.request_id)


@router.get("/runs/{run}", response_model=RunOut, summary="A run and its answer")
async def get_run(run: RunId, who: CallerDep, st: StateDep) -> dict[str, Any]:
    found = await blocking(st.ledger.run, run)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run!r}")
    # Admission as on the session's other routes: a run tells its session, actor and status.
    await blocking(session_or_404, st.ledger, found.session, who)
    return await blocking(run_json, st.ledger, found, who)


@router.get("/sessions", summary="The sessions the caller may see")
async def list_sessions(
    who: CallerDep, st: StateDep, limit: Annotated[int, Query(ge=1, le=1000)] = 1000
) -> dict[str, Any]:
    def visible() -> list[dict[str, Any]]:
        out = []
        for s in st.ledger.sessions(limit=limit):
            if sees_session(st.ledger, s.id, who):
                out.append(
                    {"session": s.id, "created": s.created, "refusing": s.refusing is not None}
                )
        return out

    return {"sessions": await blocking(visible)}


@router.get("/sessions/{session}/context", summary="The follow-up view for the caller")
async def get_context(
    session: SessionId,
    agent: AgentName,
    who: CallerDep,
    st: StateDep,
    request: str | None = None,
) -> JSONResponse:
    await blocking(session_or_404, st.ledger, session, who)
    known_agent(st, agent)
    view = await blocking(
        build_view,
        st.ledger,
        session=session,
        agent=agent,
        actor=who.actor,
        request=request,
        config=st.config.followup,
        grants=st.config.access.grants,
    )
    if isinstance(view, Refusal):
        code = 403 if view.reason is RefusalReason.ACCESS_DENIED else 409
        return JSONResponse(view.to_json(), status_code=code)
    return JSONResponse(view.to_json())


@router.get("/sessions/{session}/rows", summary="Rows after a seq, admission applied")
async def get_rows(
    session: SessionId,
    who: CallerDep,
    st: StateDep,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    await blocking(session_or_404, st.ledger, session, who)
    rows = await blocking(st.ledger.rows_range, session, after + 1, after + limit, limit=limit)
    last = await blocking(st.ledger.last_seq, session)
    shown = [row_json(r, who, st.paths) for r in rows]
    return {
        "session": session,
        "rows": shown,
        "withheld": [r["seq"] for r in shown if r.get("withheld")],
        "next": rows[-1].seq if rows and rows[-1].seq < last else None,
        "last_seq": last,
    }


@router.post("/sessions/{session}/notes", status_code=status.HTTP_201_CREATED, summary="Add a note")
async def post_note(
    session: SessionId, body: NoteIn, who: CallerDep, st: StateDep
) -> dict[str, Any]:
    """A person's note for later runs of the agent, stored with the token's actor and no run:
    the view tells it from the agent's own notes (written in a run)."""
    await blocking(session_or_404, st.ledger, session, who)
    known_agent(st, body.agent)
    try:
        note = await blocking(add_note, st.ledger, session, body.agent, body.text, actor=who.actor)
    except RecallError as exc:
        raise HTTPException(UNPROCESSABLE, str(exc)) from None
    return {
        "session": note.session,
        "agent": note.agent,
        "at": note.at,
        "actor": note.actor,
        "run": note.run,
    }


# -- lifecycle (docs/operations.md#erasure-and-retention)
# ------------------------------------------------------------------


class ForkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at_run: RunId
    """The run whose end the fork begins at."""
    session: SessionId
    """The new session's id."""


@router.post(
    "/sessions/{session}/fork",
    status_code=status.HTTP_201_CREATED,
    summary="Begin a new session as this one up to the end of a run, by reference",
)
async def post_fork(
    session: SessionId, body: ForkIn, who: CallerDep, st: StateDep
) -> dict[str, Any]:
    """The caller must be admitted to the session; the fork's inherited rows are admitted to
    whoever may read them in the session, no more (their sources are the same). The session's
    workspace is copied for the fork, as ``tether fork`` does."""
    await blocking(session_or_404, st.ledger, session, who)
    try:
        made = await blocking(st.ledger.fork_session, session, body.at_run, body.session)
    except AlreadyExists:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"session {body.session} already exists; pick another id"
        ) from None
    except NotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    except UsageError as exc:
        raise HTTPException(UNPROCESSABLE, str(exc)) from None
    last = await blocking(st.ledger.last_seq, made.id)
    await in_thread(fork_workspace, st.config, session, made.id)  # WorkspaceError: 500
    return {"session": made.id, "from": session, "at_run": body.at_run, "seq": last}


class EraseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session: SessionId | None = None
    """Erase this session whole, or"""
    source: str | None = Field(None, min_length=1, max_length=1000, pattern=r"^[^\n\r]+$")
    """every row carrying this source, and what derives from them."""
    dry_run: bool = False
    """List exactly what would be erased; erase nothing (and stop nothing)."""
    stop_grace_s: float = Field(DEFAULT_STOP_GRACE_S, ge=0, le=300)
    """Seconds a live run on an affected session is given to settle after a soft stop before
    it is stopped hard (the erasure stops it first)."""


def admin_or_403(st: ServiceState, who: Caller) -> None:
    if who.actor not in st.config.service.admins:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{who.actor} may not erase: only the actors in [service] admins may",
        )


@router.post("/erasures", summary="Erase a session or a source, keeping a receipt (admins)")
async def post_erasure(body: EraseIn, who: CallerDep, st: StateDep) -> dict[str, Any]:
    admin_or_403(st, who)
    if (body.session is None) == (body.source is None):
        raise HTTPException(UNPROCESSABLE, "give exactly one of session or source")
    selector = (
        Selector(SelectorKind.SESSION, body.session)
        if body.session is not None
        else Selector(SelectorKind.SOURCE, body.source or "")
    )
    try:
        done = await erase_stopping(
            st.ledger,
            st.config,
            selector,
            actor=who.actor,
            stop_grace_s=body.stop_grace_s,
            dry_run=body.dry_run,
        )
    except NotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no session {body.session}") from None
    except SessionBusy as exc:
        # A live run that did not end when stopped, soft then hard: the message says why.
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    assert done is not None  # only retention passes a session by
    return done.to_json()


@router.get("/erasures", summary="Erasure receipts, newest first (admins)")
async def get_erasures(
    who: CallerDep, st: StateDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> dict[str, Any]:
    admin_or_403(st, who)
    found = await blocking(st.ledger.erasures, limit=limit)
    return {"erasures": [e.to_json() for e in found]}
