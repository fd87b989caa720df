"""How the service answers what went wrong: JSON ``{"detail": …}`` on the API, an HTML page
(status, what happened, what to do) on a page. Bad input is a 4xx with a message; a 5xx only for
what failed inside, and then without the failure's text, which can name the server's files (the
ledger's path, the configuration's): that goes to the server's log."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.errors import InvalidId, LedgerError, NotFound, WorkspaceError
from tether.service.page_context import ErrorPage

__all__ = ["AsciiJSON", "error_response", "install", "is_page"]

log = logging.getLogger(__name__)

_NOT_PAGES = ("/v1/", "/live/", "/static/", "/healthz", "/metrics", "/openapi.json", "/docs")


def is_page(path: str) -> bool:
    """A page for people (HTML), not the API, a JSON twin, a stream or a fragment."""
    return not path.startswith(_NOT_PAGES) and not path.endswith((".json", ".html"))


class AsciiJSON(JSONResponse):
    """JSON in ASCII: an error may quote what the client sent, and a lone surrogate in it
    (``"\\ud800"``) cannot be encoded as UTF-8; as an escape it can."""

    def render(self, content: Any) -> bytes:
        import json

        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


WHAT_TO_DO = {
    400: "Check the address: a session, run or agent id is one printable line.",
    401: "Log in at /login with your service token.",
    403: "Ask the server's operator for a grant ([access.grants]) to the sources it names.",
    404: "Check the address; the sessions you may see are listed on the first page.",
    409: "Read the reason above; the session's page shows its state.",
    413: "Send a smaller request.",
    422: "Check the address and its query (?agent=…, ?after=…).",
    503: "Try again in a moment; if it goes on, tell the server's operator.",
}


def _text(detail: Any) -> str:
    if isinstance(detail, dict) and "detail" in detail:
        return str(detail["detail"])
    if isinstance(detail, list):  # validation errors
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in detail
        )
    return str(detail)


def error_response(
    request: Request, code: int, detail: Any, headers: Mapping[str, str] | None = None
) -> Response:
    """The error as its asker reads it: a page for a page, JSON for everything else."""
    if is_page(request.url.path):
        from tether.service.pages.assets import render

        status = HTTPStatus(code)
        page = ErrorPage(
            status=code,
            title=status.phrase,
            detail=_text(detail).encode("utf-8", "backslashreplace").decode("utf-8"),
            what_to_do=WHAT_TO_DO.get(code, WHAT_TO_DO[503] if code >= 500 else ""),
        )
        response = render("error.html", page, code=code)
        if headers:
            response.headers.update(headers)
        return response
    return AsciiJSON({"detail": detail}, status_code=code, headers=headers)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Where and what, not the input: it can be large, or not encodable."""
    return [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
        for e in exc.errors()
    ]


def install(app: FastAPI) -> None:
    """The app's error handlers."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code < 400:  # the login redirect (303 with a Location)
            return await http_exception_handler(request, exc)
        return error_response(request, exc.status_code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(request, 422, jsonable_encoder(_validation_errors(exc)))

    @app.exception_handler(InvalidId)
    async def invalid_id(request: Request, exc: InvalidId) -> Response:
        return error_response(request, 422, str(exc))

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> Response:
        return error_response(request, 404, str(exc))

    @app.exception_handler(LedgerError)
    async def ledger_down(request: Request, exc: LedgerError) -> Response:
        log.warning("ledger error on %s %s: %s", request.method, request.url.path, exc)
        return error_response(
            request, 503, "the ledger failed (the server's log says why); try again"
        )

    @app.exception_handler(WorkspaceError)
    async def workspace_failed(request: Request, exc: WorkspaceError) -> Response:
        log.warning("workspace error on %s %s: %s", request.method, request.url.path, exc)
        return error_response(
            request, 500, "a session's workspace failed (the server's log says why)"
        )
