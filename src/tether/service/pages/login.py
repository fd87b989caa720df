"""Who is asking a page: the API's bearer token, or the HttpOnly cookie ``POST /login`` sets
with it (a browser's EventSource cannot send a header); the login form and logout.

Both forms refuse a post from another site's page (403, saying so, nothing changed): its
``Origin`` (or, without one, its ``Referer``) must name this server as the browser reached it
(the ``Host`` it sent), and a browser's ``Sec-Fetch-Site``, when it sends one, must say
``same-origin``. Each form also carries a token a page of another site cannot know: the login
form the value of a cookie ``GET /login`` sets (double submit), the log-out form a digest of the
login cookie itself (:func:`logout_token`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import RedirectResponse, Response

from tether.access import Admission
from tether.service.auth import Caller, actor_for
from tether.service.page_context import LoginPage
from tether.service.pages.assets import render
from tether.service.state import ServiceState, service_of

__all__ = [
    "COOKIE",
    "FORM_COOKIE",
    "PageCaller",
    "StateDep",
    "cross_site",
    "logout_token",
    "page_caller",
    "router",
]

COOKIE = "tether_token"
FORM_COOKIE = "tether_form"
"""The login form's token, double-submitted: the cookie ``GET /login`` sets, and the form's
hidden field."""

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


def cross_site(request: Request) -> str | None:
    """Why a form post does not come from a page of this server, or None. A browser names the
    page's origin (``Origin``; ``Referer`` without one) and, lately, how it relates to this one
    (``Sec-Fetch-Site``: ``same-site`` is another port or subdomain, so another origin)."""
    host = request.headers.get("host", "").lower()
    origin = request.headers.get("origin")
    if origin is not None:
        if origin == "null" or urlsplit(origin).netloc.lower() != host:
            return f"Origin {origin} is not this server, {host or 'unknown'}"
    else:
        referer = request.headers.get("referer")
        if referer and urlsplit(referer).netloc.lower() != host:
            return f"Referer {urlsplit(referer).netloc} is not this server, {host or 'unknown'}"
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {fetch_site}"
    return None


def logout_token(request: Request) -> str | None:
    """The log-out form's token: a digest of the login cookie (which a page of another site
    cannot read), None without one."""
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return None
    return hashlib.sha256(f"tether.logout\0{cookie}".encode()).hexdigest()


def _field(form: dict[str, list[str]], name: str) -> str:
    return (form.get(name) or [""])[0]


def _login_page(
    request: Request, target: str, error: str | None, code: int = status.HTTP_200_OK
) -> Response:
    """The login form, with its token: the form cookie's value (set here when missing)."""
    known = request.cookies.get(FORM_COOKIE, "")
    token = known if len(known) == 43 and known.isascii() else secrets.token_urlsafe(32)
    response = render(
        "login.html", LoginPage(next=target, error=error, form_token=token), code=code
    )
    if token != known:
        response.set_cookie(
            FORM_COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/login",
        )
    return response


def _refused(request: Request, why: str, what: str) -> Response:
    error = (
        f"Refused: this {what} was posted from another site's page ({why}), not from this "
        "server's form. Nothing was changed."
    )
    return _login_page(request, "/", error, status.HTTP_403_FORBIDDEN)


@router.get("/login")
async def login_form(request: Request, next: str | None = None) -> Response:
    return _login_page(request, _safe_next(next), None)


@router.post("/login")
async def login(request: Request, st: StateDep) -> Response:
    why = cross_site(request)
    if why is not None:
        return _refused(request, why, "log-in")
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = _field(form, "token").strip()
    target = _safe_next(_field(form, "next") or "/")
    sent, kept = _field(form, "form_token"), request.cookies.get(FORM_COOKIE, "")
    if not kept or not hmac.compare_digest(sent.encode(), kept.encode()):
        error = (
            "Refused: this log-in form was not this server's (its token is missing or does not "
            "match the form cookie; it may have expired, or come from another site's page). "
            "Nothing was changed; log in with this form."
        )
        return _login_page(request, target, error, status.HTTP_403_FORBIDDEN)
    if not token or actor_for(st.config.service.tokens, token) is None:
        error = "unknown token: its SHA-256 is not in [service.tokens]"
        return _login_page(request, target, error, status.HTTP_401_UNAUTHORIZED)
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
async def logout(request: Request) -> Response:
    why = cross_site(request)
    if why is not None:
        return _refused(request, why, "log-out")
    expected = logout_token(request)
    if expected is not None:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        if not hmac.compare_digest(_field(form, "form_token").encode(), expected.encode()):
            return _refused(request, "its form token is not this server's", "log-out")
    response = RedirectResponse("/login", status.HTTP_303_SEE_OTHER)
    response.delete_cookie(COOKIE, path="/")
    return response
