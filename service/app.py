"""The FastAPI application factory; everything stateful is built in its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.responses import Response

from service.api import admin, health, ingest, metrics
from service.core.config import Settings
from service.core.cursor import cursor_key
from service.core.db import create_engine, database_url
from service.core.metrics import Metrics
from service.core.migrations import head_revision
from service.core.problems import install_problem_handlers, unavailable
from service.core.request_id import RequestIdMiddleware
from service.core.security import ensure_admin_tokens
from service.core.state import AppState
from service.inbox_config import InboxConfig, load_inbox_config
from service.store.errors import StoreUnavailable
from service.store.group_commit import GroupCommitter

DESCRIPTION = """
webhook-inbox receives webhooks and push deliveries, records each message id in PostgreSQL
before answering 2xx, and runs each accepted message's handlers exactly once.

Errors are RFC 9457 `application/problem+json` documents.
"""


def create_app(settings: Settings | None = None, inbox: InboxConfig | None = None) -> FastAPI:
    """Build the app; the database engine is created when it starts, not at import."""
    settings = settings or Settings()
    inbox = inbox if inbox is not None else load_inbox_config(Path(settings.config))
    # Per app, not per module: each test's app (and each server process) counts on its own.
    app_metrics = Metrics(sources=inbox.sources)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tokens, _ = ensure_admin_tokens(settings)
        engine = create_engine(database_url(settings), settings)
        committer = GroupCommitter(
            engine,
            flushers=settings.ingest_flushers,
            max_queued=settings.ingest_max_queued,
            wait_timeout=settings.db_timeout_seconds * 2,
        )
        app.state.inbox = AppState(
            settings=settings,
            inbox=inbox,
            engine=engine,
            committer=committer,
            head_revision=head_revision(),
            metrics=app_metrics,
            admin_tokens=tokens,
            cursor_key=cursor_key(tokens),
        )
        committer.start()
        try:
            yield
        finally:
            await committer.close()
            await engine.dispose()

    app = FastAPI(
        title="webhook-inbox",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    install_problem_handlers(app)
    app.add_middleware(RequestIdMiddleware)

    async def on_store_unavailable(request: Request, exc: Exception) -> Response:
        return unavailable("the database is unavailable; try again shortly")

    app.add_exception_handler(StoreUnavailable, on_store_unavailable)
    app.include_router(ingest.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(admin.router)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory`, as each server process of `serve --workers N` calls it."""
    return create_app()
