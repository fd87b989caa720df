"""The pages without a browser: each page's context object is documented field by field and its
JSON twin returns exactly those fields; authentication and admission as in the API; the
sessions overview read on every ledger backend. (The browser suite is tests/test_pages.py.)"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from support.service import service_config, text_message
from tether.config import load_config
from tether.ledger import Ledger, NewRow, RunStatus, open_ledger
from tether.service import api, page_context
from tether.service.app import create_app
from tether.service.pages import COOKIE
from tether.service.pages.contexts import answer_row
from tether.service.pages.login import FORM_COOKIE

CONTEXTS = [
    getattr(page_context, name)
    for name in page_context.__all__
    if dataclasses.is_dataclass(getattr(page_context, name))
]


@pytest.mark.parametrize("cls", CONTEXTS, ids=lambda c: c.__name__)
def test_every_context_field_says_what_it_holds(cls: Any) -> None:
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, Ledger]]:
    config = service_config(
        tmp_path, grants={"user:ana": ["repo:acme/*"]}, tokens={"ana-token": "user:ana"}
    )
    cfg = load_config(config)
    with open_ledger(cfg.ledger.url) as ledger:
        ledger.ensure_session("s1")
        fence = ledger.claim_run(ledger.create_run("s1", "rev").id)
        ledger.append(
            fence, [NewRow.message("user:ana", text_message("user", "hello"))], request=True
        )
        ledger.append(
            fence,
            [
                NewRow.message("agent:rev", text_message("assistant", f"answer {i}"))
                for i in range(1, 30)
            ]
            + [
                NewRow.message(
                    "agent:rev",
                    text_message("assistant", "the secret part"),
                    sources=("doc:secret",),
                )
            ],
        )
        ledger.end_run(fence, RunStatus.FINISHED)
        with TestClient(create_app(cfg, ledger)) as c:
            yield c, ledger


JSON_TWINS = {
    "/index.json": page_context.IndexPage,
    "/sessions/s1.json": page_context.TimelinePage,
    "/sessions/s1/next.json?agent=rev": page_context.NextPage,
    "/sessions/s1/search.json?q=answer": page_context.SearchPage,
}


@pytest.mark.parametrize("url", sorted(JSON_TWINS))
def test_a_json_twin_is_its_page_context(client: Any, url: str) -> None:
    c, _ = client
    got = c.get(url, headers={"Authorization": "Bearer ana-token"})
    assert got.status_code == 200, got.text
    assert set(got.json()) == {f.name for f in dataclasses.fields(JSON_TWINS[url])}
    page = c.get(
        url.replace(".json", "").replace("/index", "/"),
        headers={"Authorization": "Bearer ana-token"},
    )
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'rel="alternate"' in page.headers["link"]


def test_pages_need_a_token_and_login_sets_an_httponly_cookie(client: Any) -> None:
    c, _ = client
    page = c.get("/sessions/s1?after=3", follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=%2Fsessions%2Fs1%3Fafter%3D3"
    assert c.get("/sessions/s1.json").status_code == 401
    assert c.get("/sessions/s1/rows.html").status_code == 401
    assert c.get("/live/runs/x/events").status_code == 401
    assert c.get("/live/sessions/s1/events").status_code == 401
    found = c.get("/sessions/s1/search?q=answer", follow_redirects=False)
    assert found.status_code == 303  # to the login form
    assert c.get("/sessions/s1/search.json?q=answer").status_code == 401
    ana = {"Authorization": "Bearer ana-token"}
    assert c.get("/live/sessions/nope/events", headers=ana).status_code == 404
    # The form carries a token, the value of the form cookie GET /login sets (double submit).
    form = c.get("/login")
    token = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert token is not None
    assert c.cookies.get(FORM_COOKIE) == token[1]
    missing = c.post("/login", data={"token": "ana-token", "next": "/"}, follow_redirects=False)
    assert missing.status_code == 403
    assert COOKIE not in missing.headers.get("set-cookie", "")
    bad = c.post(
        "/login",
        data={"token": "nope", "next": "/", "form_token": token[1]},
        follow_redirects=False,
    )
    assert bad.status_code == 401
    assert COOKIE not in bad.headers.get("set-cookie", "")
    # A login never sends the browser to another site.
    ok = c.post(
        "/login",
        data={"token": "ana-token", "next": "//evil.example/x", "form_token": token[1]},
        follow_redirects=False,
    )
    assert ok.status_code == 303
    assert ok.headers["location"] == "/"
    cookie = ok.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert c.get("/sessions/s1.json").status_code == 200  # the cookie now authenticates
    # Log out: the form's token is a digest of the login cookie, which the page carries.
    assert c.post("/logout", follow_redirects=False).status_code == 403
    assert c.get("/sessions/s1.json").status_code == 200
    page = c.get("/")
    out = re.search(
        r'action="/logout"><input type="hidden" name="form_token" value="([^"]+)"', page.text
    )
    assert out is not None
    assert c.post("/logout", data={"form_token": out[1]}, follow_redirects=False).status_code == 303
    assert c.get("/sessions/s1.json").status_code == 401


def test_a_form_posted_from_another_origin_is_refused(client: Any) -> None:
    c, _ = client
    token = re.search(r'name="form_token" value="([^"]+)"', c.get("/login").text)
    assert token is not None
    data = {"token": "ana-token", "next": "/", "form_token": token[1]}
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Referer": "http://evil.example/page"},
        {"Origin": "http://testserver", "Sec-Fetch-Site": "same-site"},
        {"Origin": "http://testserver", "Sec-Fetch-Site": "cross-site"},
    ):
        refused = c.post("/login", data=data, headers=headers, follow_redirects=False)
        assert refused.status_code == 403, headers
        assert "another site" in refused.text
        assert COOKIE not in refused.headers.get("set-cookie", "")
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    assert c.post("/login", data=data, headers=same, follow_redirects=False).status_code == 303


def test_the_timeline_pages_by_seq_and_withholds_like_the_api(client: Any) -> None:
    c, ledger = client
    h = {"Authorization": "Bearer ana-token"}
    page = c.get("/sessions/s1.json?limit=10", headers=h).json()
    last = ledger.last_seq("s1")
    assert (page["after"], page["first_shown"], page["last_shown"]) == (last - 10, last - 9, last)
    assert page["older"] == last - 20
    assert page["newer"] is None
    older = c.get(f"/sessions/s1.json?after={page['older']}&limit=10", headers=h).json()
    assert older["newer"] == last - 10
    rows = [r for g in page["groups"] for r in g["rows"]]
    assert rows[-1] == {"seq": last, "kind": "withheld"}
    api = c.get(f"/v1/sessions/s1/rows?after={last - 10}&limit=10", headers=h).json()
    assert api["withheld"] == [last]
    html = c.get("/sessions/s1", headers=h).text
    assert "the secret part" not in html
    assert "withheld" in html
    assert c.get("/sessions/nope", headers=h).status_code == 404


def test_the_sessions_overview_is_newest_first_with_run_counts(ledger: Ledger) -> None:
    for i, name in enumerate(["a", "b", "c"]):
        ledger.create_session(name, created=f"2026-11-29T10:00:0{i}Z")
    fence = ledger.claim_run(ledger.create_run("b", "rev").id)
    ledger.append(fence, [NewRow.message("user:ana", text_message("user", "x"))], request=True)
    ledger.end_run(fence, RunStatus.FAILED)
    ledger.create_run("b", "rev")
    got = ledger.session_overview(limit=2)
    assert [(s.id, last) for s, last, _ in got] == [("c", 0), ("b", 1)]
    assert got[1][2] == {RunStatus.FAILED: 1, RunStatus.QUEUED: 1}
    assert got[0][2] == {}


def test_a_runs_answer_row_is_found_from_its_end(ledger: Ledger) -> None:
    """The pages' answer_row (read backwards, bounded pages) finds the row api.answer_row finds."""
    ledger.ensure_session("s")
    fence = ledger.claim_run(ledger.create_run("s", "rev").id)
    ledger.append(fence, [NewRow.message("user:ana", text_message("user", "go"))], request=True)
    ledger.append(fence, [NewRow.message("agent:rev", text_message("assistant", "early"))])
    # More rows after the answer than one backward page holds.
    ledger.append(fence, [NewRow.message("agent:rev", text_message("assistant", "the answer"))])
    ledger.append(
        fence,
        [NewRow.message("tool:bash", text_message("toolResult", f"out {i}")) for i in range(70)],
    )
    run = ledger.end_run(fence, RunStatus.FINISHED, extra={"answer": "the answer"})
    mine = answer_row(ledger, run)
    assert mine is not None
    assert mine == api.answer_row(ledger, run)
    assert mine.body["content"][0]["text"] == "the answer"
    assert [r.seq for r in ledger.run_rows_before(run.id, 10, limit=3)] == [9, 8, 7]


def test_row_content_is_escaped_and_only_images_become_data_urls(client: Any) -> None:
    c, ledger = client
    fence = ledger.claim_run(ledger.create_run("s1", "rev").id)
    evil = {
        "role": "user",
        "content": [
            {"type": "text", "text": "<script>alert(1)</script>"},
            {"type": "image", "data": "PGgxPmhpPC9oMT4=", "mimeType": "text/html"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
        ],
        "timestamp": 1,
    }
    ledger.append(fence, [NewRow.message("user:ana", evil)], request=True)
    ledger.end_run(fence, RunStatus.FINISHED)
    page = c.get("/sessions/s1", headers={"Authorization": "Bearer ana-token"})
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "data:text/html" not in page.text
    assert "data:image/png;base64,iVBORw0KGgo=" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_next_without_an_agent_goes_to_the_only_one_or_offers_a_choice(
    client: Any, tmp_path: Path
) -> None:
    """`/sessions/S/next` with no `?agent=`: one agent configured, its view; several, a page
    linking each (not a framework error)."""
    c, ledger = client
    ana = {"Authorization": "Bearer ana-token"}
    one = c.get("/sessions/s1/next", headers=ana, follow_redirects=False)
    assert one.status_code == 303, one.text
    assert one.headers["location"] == "/sessions/s1/next?agent=rev"
    assert c.get("/sessions/nope/next", headers=ana).status_code == 404
    config = tmp_path / "tether.toml"
    config.write_text(
        config.read_text().replace(
            "[access.grants]", '[agents.writer]\nprovider = "local"\nmodel = "m"\n[access.grants]'
        )
    )
    with TestClient(create_app(load_config(config), ledger)) as two:
        page = two.get("/sessions/s1/next", headers=ana)
    assert page.status_code == 200, page.text
    assert 'href="/sessions/s1/next?agent=rev"' in page.text
    assert 'href="/sessions/s1/next?agent=writer"' in page.text
