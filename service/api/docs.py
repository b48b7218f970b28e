"""`/docs` (Swagger UI) and `/redoc`, with their scripts and styles served by the service itself.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so they are blank on a machine without
internet. The assets come from the `fastapi-offline` package, which vendors both; the pages are
FastAPI's own, pointed at them.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
ASSETS_PATH = "/docs/static"
# No online spec validator: Swagger UI would otherwise ask one on the internet for a badge.
SWAGGER_PARAMETERS = {"validatorUrl": None}


def install(app: FastAPI) -> None:
    """Serve `/docs`, `/redoc` and their assets; the app must be built with `docs_url=None`
    and `redoc_url=None`, so that FastAPI's CDN pages are not registered too."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    app.add_api_route("/redoc", redoc, include_in_schema=False)


async def swagger_ui(request: Request) -> HTMLResponse:
    openapi_url, assets = served_urls(request)
    return get_swagger_ui_html(
        openapi_url=openapi_url,
        title=f"{request.app.title} - Swagger UI",
        swagger_ui_parameters=SWAGGER_PARAMETERS,
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css",
        swagger_favicon_url=f"{assets}/favicon.png",
    )


async def redoc(request: Request) -> HTMLResponse:
    openapi_url, assets = served_urls(request)
    return get_redoc_html(
        openapi_url=openapi_url,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{assets}/redoc.standalone.js",
        redoc_favicon_url=f"{assets}/favicon.png",
        with_google_fonts=False,
    )


def served_urls(request: Request) -> tuple[str, str]:
    """The app's OpenAPI document and the folder of the pages' assets, as the browser reaches
    them: under the root path a proxy serves the app at."""
    root = request.scope.get("root_path", "")
    return f"{root}{request.app.openapi_url}", f"{root}{ASSETS_PATH}"
