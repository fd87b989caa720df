"""Pages for people (docs/contracts.md#the-http-api): ``/`` (sessions), ``/sessions/{session}``
(the timeline,
``?after=SEQ`` pages on), ``/sessions/{session}/next?agent=A`` (the follow-up view for the caller).

Each page renders one context object (:mod:`tether.service.page_context`), and its JSON twin
(``/index.json``, ``/sessions/{session}.json``, ``/sessions/{session}/next.json``) returns that same
object, as Datasette does. Authentication is the API's: the bearer token, or the HttpOnly cookie
``POST /login`` sets with it; admission is the API's too (:func:`tether.service.api.row_json`,
``sees_session``, ``run_json``), so a page never shows what the actor could not read through the
API. Reads are bounded: a page of rows by seq, the runs those rows belong to, the live ones.

Modules, one job each: ``login`` (who is asking: token or cookie, the login form), ``assets``
(templates, rendering, static files with their content hash), ``display`` (a row or a pi message
as the templates show it), ``contexts`` (the context object of each page, from bounded ledger
reads), ``routes`` (the pages, their JSON twins and fragments), ``live`` (a run's events for the
pages' script).
"""

from __future__ import annotations

from fastapi import APIRouter

from tether.service.pages import assets, live, login, routes
from tether.service.pages.login import COOKIE

__all__ = ["COOKIE", "router"]

router = APIRouter(include_in_schema=False)
# Order matters: ``/sessions/{session}.json`` must be tried before ``/sessions/{session}``.
router.include_router(login.router)
router.include_router(assets.router)
router.include_router(routes.router)
router.include_router(live.router)
