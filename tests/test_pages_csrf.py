"""The page forms refuse cross-site posts, in a real headless Chromium: a page served from another
origin on 127.0.0.1 (another port: the same *site*, so even SameSite=Strict cookies go along)
auto-submits a form to the service's ``/login`` (logging the victim in as the attacker's actor)
or ``/logout``; both are refused with 403 and a message, and nothing changes in the browser. A
login through the service's own form still works, and so does its own logout button."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext

from service_support import serve, write_config
from support.browser import browser

__all__ = ["browser"]  # the fixture (support.browser)

pytestmark = pytest.mark.slow

COOKIE = "tether_token"


def _attack(target: str, fields: dict[str, str]) -> bytes:
    inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
    return (
        f'<!doctype html><html><body><form method="post" action="{target}">{inputs}</form>'
        "<script>document.forms[0].submit()</script></body></html>"
    ).encode()


@contextlib.contextmanager
def attacker(service: str) -> Iterator[str]:
    """Another origin on 127.0.0.1: /login-as-bob and /logout auto-submit a form to the service."""
    pages = {
        "/login-as-bob": _attack(f"{service}/login", {"token": "bob-token", "next": "/"}),
        "/logout": _attack(f"{service}/logout", {}),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, b"no such page")
            self.send_response(200 if self.path in pages else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _token_cookie(context: BrowserContext) -> str | None:
    found = [c["value"] for c in context.cookies() if c["name"] == COOKIE]
    return found[0] if found else None


def test_cross_site_login_and_logout_are_refused_and_same_site_ones_work(
    browser: Browser, tmp_path: Path
) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with serve(tmp_path, config, workers=0) as s, attacker(s.url) as evil:
        # 1. Logged out, the victim opens the attacker's page: its form logs in as bob.
        victim = browser.new_context()
        page = victim.new_page()
        with page.expect_response(f"{s.url}/login") as posted:
            page.goto(f"{evil}/login-as-bob")
        assert posted.value.status == 403
        page.wait_for_load_state()
        assert "another site" in page.inner_text("main")
        assert _token_cookie(victim) is None, "the attacker's form logged the browser in"
        # 2. The victim logs in through the service's own form (same origin): that works.
        page.goto(f"{s.url}/")
        assert "/login" in page.url
        page.fill("#token", "ana-token")
        page.click("button[type=submit]")
        page.wait_for_url(f"{s.url}/")
        assert "user:ana" in page.inner_text("header")
        assert _token_cookie(victim) == "ana-token"
        # 3. The attacker's page posts to /logout: refused, the victim stays logged in.
        with page.expect_response(f"{s.url}/logout") as posted:
            page.goto(f"{evil}/logout")
        assert posted.value.status == 403
        page.wait_for_load_state()
        assert "another site" in page.inner_text("main")
        assert _token_cookie(victim) == "ana-token", "the attacker's form logged the browser out"
        page.goto(f"{s.url}/")
        assert page.url == f"{s.url}/"
        assert "user:ana" in page.inner_text("header")
        # 4. The page's own log-out button works.
        page.click("form.who button")
        page.wait_for_url(f"{s.url}/login")
        assert _token_cookie(victim) is None
        victim.close()
