"""The web console (docs/console.md): the admin API as pages for people, under /console/."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from service.api.console import (
    actions,
    bulk,
    export,
    issues,
    live,
    outbox,
    pages,
    rejected,
    signin,
)
from service.api.console.access import (
    ConsoleError,
    SignInRequired,
    on_console_error,
    on_sign_in_required,
)
from service.api.console.assets import STATIC_PATH, StaticAssets
from service.api.console.headers import ConsoleHeaders

router = APIRouter(prefix="/console", include_in_schema=False)
router.include_router(signin.router)
# Before pages: its `/messages/{message}` would take `export` for a message.
router.include_router(export.router)
router.include_router(pages.router)
router.include_router(actions.router)
router.include_router(bulk.router)
router.include_router(rejected.router)
router.include_router(outbox.router)
router.include_router(issues.router)
router.include_router(live.router)


def install(app: FastAPI) -> None:
    """Serve the console's pages, its static files, its headers and its error pages."""
    app.include_router(router)
    app.mount(STATIC_PATH, StaticAssets(), name="console-static")
    app.add_middleware(ConsoleHeaders)
    app.add_exception_handler(SignInRequired, on_sign_in_required)
    app.add_exception_handler(ConsoleError, on_console_error)


__all__ = ["install", "router"]
