"""Templates, rendering and static files: ``/static/NAME?h=…`` carries the file's content hash,
so a browser caches it for a day and still sees a change at once (Datasette's way)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

from tether.service.paths import ServerPaths

__all__ = [
    "CSP",
    "ROW_CONTEXT",
    "STATIC",
    "env",
    "json_page",
    "mark_words",
    "render",
    "router",
    "row_href",
    "run_href",
    "static_url",
]

SERVICE = Path(__file__).parent.parent
STATIC = SERVICE / "static"
TEMPLATES = SERVICE / "templates"

router = APIRouter(include_in_schema=False)

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; frame-ancestors 'none'; form-action 'self'"
)
"""Scripts only from /static; inline styles only for the budget bar's widths."""


@cache
def env() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.globals["static"] = static_url
    environment.globals["row_href"] = row_href
    environment.globals["run_href"] = run_href
    environment.filters["tojson_compact"] = lambda v: json.dumps(v, ensure_ascii=False, indent=1)
    environment.filters["q"] = lambda v: quote(str(v), safe="")
    environment.filters["mark"] = mark_words
    return environment


@cache
def static_url(name: str) -> str:
    """``/static/NAME?h=…``: the hash busts caches when the file changes."""
    digest = hashlib.sha256((STATIC / name).read_bytes()).hexdigest()[:12]
    return f"/static/{name}?h={digest}"


ROW_CONTEXT = 10
"""Rows shown above a row that a link opens on another page: what led to it."""


def row_href(session: str, seq: int, shown: tuple[int | None, int] | None = None) -> str:
    """Where row ``seq`` of ``session`` is: its anchor on this page when the page shows it
    (``shown``: the page's first and last seq), else the page that holds it."""
    if shown is not None and shown[0] is not None and shown[0] <= seq <= shown[1]:
        return f"#row-{seq}"
    after = max(0, seq - 1 - ROW_CONTEXT)
    return f"/sessions/{quote(session, safe='')}?after={after}#row-{seq}"


def run_href(session: str, run: str) -> str:
    """A run's place on its session's page (the route redirects to the page that holds it)."""
    return f"/sessions/{quote(session, safe='')}/runs/{quote(run, safe='')}"


def mark_words(text: str, query: str) -> Markup:
    """``text`` escaped, each word of ``query`` in it wrapped in ``<mark>`` (a search hit)."""
    words = sorted({w for w in query.split() if w}, key=len, reverse=True)
    if not words:
        return escape(text)
    pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE)
    out, at = [], 0
    for found in pattern.finditer(text):
        out += [escape(text[at : found.start()]), Markup("<mark>%s</mark>") % found.group()]
        at = found.end()
    return Markup("").join([*out, escape(text[at:])])


def render(
    name: str,
    ctx: Any,
    *,
    json_url: str | None = None,
    code: int = 200,
    form_token: str | None = None,
    paths: ServerPaths | None = None,
) -> HTMLResponse:
    """Template ``name`` over the context object ``ctx``, with the pages' security headers and
    a ``Link`` to the page's JSON twin. ``form_token``: the log-out form's token (a page whose
    header has that form; :func:`~tether.service.pages.login.logout_token`). ``paths``: the
    server's directories, which no page names (tether.service.paths)."""
    data = context_data(ctx, paths)
    html = env().get_template(name).render(ctx=data, json_url=json_url, form_token=form_token)
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}
    if json_url:
        headers["Link"] = f'<{json_url}>; rel="alternate"; type="application/json"'
    return HTMLResponse(html, status_code=code, headers=headers)


def json_page(ctx: Any, code: int = 200, paths: ServerPaths | None = None) -> JSONResponse:
    """A JSON twin: the page's context object as is (the server's directories rewritten)."""
    return JSONResponse(context_data(ctx, paths), status_code=code)


def context_data(ctx: Any, paths: ServerPaths | None) -> Any:
    """A page's context object as the templates and the JSON twins get it: what pi's rows and
    tools name of the server's filesystem rewritten (``<workspace>``, …) when ``paths``."""
    data = asdict(ctx)
    return paths.scrub(data) if paths is not None else data


@router.get("/static/{name}")
async def static_file(name: str) -> FileResponse:
    path = STATIC / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no static file {name!r}")
    return FileResponse(path, headers={"Cache-Control": "public, max-age=86400"})
