"""``/docs``: Swagger UI over ``/openapi.json``, its files served by the service itself.

FastAPI's own page loads Swagger UI's script and style from a CDN, so on a host without the
internet (as services often are) it stays blank. The files come from the ``fastapi-swagger``
package, which ships a current Swagger UI (5.x, for FastAPI's OpenAPI 3.1)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

__all__ = ["ASSETS", "install"]

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
}
_PREFIX = "/docs-assets/"


def install(app: FastAPI) -> None:
    """``GET /docs`` and its two files under ``/docs-assets/`` (the app is made with
    ``docs_url=None``, so FastAPI adds no page of its own)."""
    files = resources.files("fastapi_swagger") / "resources"

    async def page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} API",
            swagger_js_url=f"{root}{_PREFIX}swagger-ui-bundle.js",
            swagger_css_url=f"{root}{_PREFIX}swagger-ui.css",
            swagger_favicon_url=f"{root}{_PREFIX}none",
        )

    def asset(name: str, media_type: str) -> Callable[[], Awaitable[Response]]:
        async def serve() -> Response:
            headers = {"Cache-Control": "public, max-age=86400"}
            return Response((files / name).read_bytes(), media_type=media_type, headers=headers)

        return serve

    app.add_api_route("/docs", page, methods=["GET"], include_in_schema=False)
    for name, media_type in ASSETS.items():
        app.add_api_route(
            _PREFIX + name, asset(name, media_type), methods=["GET"], include_in_schema=False
        )
