"""Who is asking a page: the API's bearer token, or the HttpOnly cookie ``POST /login`` sets
with it (a browser's EventSource cannot send a header); the login form and logout."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from tether.access import Admission
from tether.service.auth import Caller, actor_for
from tether.service.page_context import LoginPage
from tether.service.pages.assets import render
from tether.service.state import ServiceState, service_of

__all__ = ["COOKIE", "PageCaller", "StateDep", "page_caller", "router"]

COOKIE = "tether_token"

router = APIRouter(include_in_schema=False)


def _state(request: Request) -> ServiceState:
    return service_of(request.app)


StateDep = Annotated[ServiceState, Depends(_state)]


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


@router.get("/login")
async def login_form(next: str | None = None) -> HTMLResponse:
    return render("login.html", LoginPage(next=_safe_next(next), error=None))


@router.post("/login")
async def login(request: Request, st: StateDep) -> Response:
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or ["/"])[0])
    if not token or actor_for(st.config.service.tokens, token) is None:
        page = LoginPage(next=target, error="unknown token: its SHA-256 is not in [service.tokens]")
        return render("login.html", page, code=status.HTTP_401_UNAUTHORIZED)
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
