"""``/docs`` works offline: Swagger UI's files come from the service itself, and the page,
opened in Debian's chromium with every other host unreachable, renders the API's routes."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from service_support import serve, write_config
from support.browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow


def test_docs_render_with_no_host_but_the_service(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with serve(tmp_path, config, workers=0) as served:
        page_html = served.client.get("/docs")
        assert page_html.status_code == 200
        assert "cdn." not in page_html.text, page_html.text
        asked: list[str] = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()

                def only_the_service(route, request) -> None:  # type: ignore[no-untyped-def]
                    asked.append(request.url)
                    if request.url.startswith(served.url):
                        route.continue_()
                    else:
                        route.abort()

                page.route("**/*", only_the_service)
                page.goto(served.url + "/docs")
                route = page.locator('[data-path="/v1/sessions/{session}/requests"]').first
                route.wait_for(timeout=20_000)
                page.screenshot(path=str(tmp_path / "docs.png"))
            finally:
                browser.close()
        assert all(url.startswith(served.url) for url in asked), asked
