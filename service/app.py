"""The FastAPI application factory; everything stateful is built in its lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.api import admin, console, docs, health, ingest, metrics
from service.api.admin.cursor import cursor_key
from service.api.problems import install_problem_handlers, unavailable
from service.api.request_id import RequestIdMiddleware
from service.api.state import AppState
from service.core.admin_tokens import ensure_admin_tokens
from service.core.db import create_engine, database_url
from service.core.metrics import Metrics
from service.core.settings import Settings
from service.processing.pipeline import resolve_pipelines
from service.sources.config_file import InboxConfig, load_inbox_config
from service.store.counts import EndedCounts
from service.store.errors import StoreUnavailable
from service.store.group_commit import ingest_committer
from service.store.rejections import RejectionLog

log = logging.getLogger("service.app")

DESCRIPTION = """
webhook-inbox receives webhooks and push deliveries, records each message id in PostgreSQL
before answering 2xx, and runs each accepted message's handlers exactly once.

Errors are RFC 9457 `application/problem+json` documents.
"""


def create_app(
    settings: Settings | None = None,
    inbox: InboxConfig | None = None,
    *,
    processing_state: Path | None = None,
) -> FastAPI:
    """Build the app; the database engine is created when it starts, not at import.

    Handler modules are imported here (sync mode runs them in the request), so a bad
    `module:function` fails before serving. The worker never runs in this process: `serve`
    runs it in processes of its own. `processing_state`: the supervisor's file saying how
    many processing processes are alive, for `/readyz`.
    """
    settings = settings or Settings()
    inbox = inbox if inbox is not None else load_inbox_config(Path(settings.config))
    inbox.require_secrets()  # the app verifies every source: none may be read lazily
    # Per app, not per module: each test's app (and each server process) counts on its own.
    app_metrics = Metrics(sources=inbox.row_sources)
    pipelines = resolve_pipelines(inbox)

    @asynccontextmanager
    async def lifespan(app: InboxApp) -> AsyncIterator[None]:
        tokens, _ = ensure_admin_tokens(settings)
        url = database_url(settings)
        engine = create_engine(url, settings)
        committer = ingest_committer(engine, settings, app_metrics)
        rejections = RejectionLog(
            engine,
            settings.rejected_per_source,
            on_dropped=lambda source, count: app_metrics.rejections_unrecorded.labels(source).inc(
                count
            ),
        )
        app.state.inbox = AppState(
            settings=settings,
            inbox=inbox,
            engine=engine,
            committer=committer,
            rejections=rejections,
            ended_counts=EndedCounts(engine),
            metrics=app_metrics,
            admin_tokens=tokens,
            cursor_key=cursor_key(tokens),
            pipelines=pipelines,
            processing_state=processing_state,
        )
        committer.start()
        rejections.start()
        app.direct_ingest = ingest.DirectIngest(app.state.inbox)
        try:
            yield
        finally:
            app.direct_ingest = None
            # Before the engine goes: a bulk action's run marks itself interrupted.
            await app.state.inbox.background.close()
            await committer.close()
            await rejections.close()
            await app.state.inbox.ended_counts.close()
            await engine.dispose()

    app = InboxApp(
        title="webhook-inbox",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served offline by service.api.docs instead of from a CDN
        redoc_url=None,
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
    console.install(app)
    docs.install(app)
    return app


class InboxApp(FastAPI):
    """FastAPI, with the ingest hot path served before FastAPI's own layers (see
    `service.api.ingest.serve_ingest`); every other request goes through FastAPI.

    `direct_ingest`, while the app runs, serves plain deliveries for the HTTP protocol without
    ASGI at all (`service.api.http_protocol`)."""

    direct_ingest: ingest.DirectIngest | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            state = getattr(self.state, "inbox", None)
            if state is not None and await ingest.serve_ingest(state, scope, receive, send):
                return
        await super().__call__(scope, receive, send)
