"""The FastAPI application factory; everything stateful is built in its lifespan."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.api import admin, health, ingest, metrics
from service.core.config import Settings
from service.core.cursor import cursor_key
from service.core.db import create_engine, database_url
from service.core.logging import configure_logging
from service.core.metrics import Metrics
from service.core.migrations import head_revision
from service.core.problems import install_problem_handlers, unavailable
from service.core.request_id import RequestIdMiddleware
from service.core.security import ensure_admin_tokens
from service.core.state import AppState
from service.inbox_config import InboxConfig, load_inbox_config
from service.processing.pipeline import resolve_pipelines
from service.store.errors import StoreUnavailable
from service.store.group_commit import GroupCommitter
from service.worker import run_worker

log = logging.getLogger("service.app")

# Set by `webhook-inbox serve` for the server processes uvicorn starts with --workers N.
RUN_WORKER_ENV = "INBOX_SERVE_WORKER"

DESCRIPTION = """
webhook-inbox receives webhooks and push deliveries, records each message id in PostgreSQL
before answering 2xx, and runs each accepted message's handlers exactly once.

Errors are RFC 9457 `application/problem+json` documents.
"""


def create_app(
    settings: Settings | None = None,
    inbox: InboxConfig | None = None,
    *,
    run_worker_in_process: bool = False,
    exit_on_worker_crash: bool = False,
) -> FastAPI:
    """Build the app; the database engine is created when it starts, not at import.

    Handler modules are imported here, so a bad `module:function` fails before serving.
    With `run_worker_in_process`, the lifespan also runs the worker (`serve` without
    `--no-worker`); `exit_on_worker_crash` then stops the server if the worker dies.
    """
    settings = settings or Settings()
    inbox = inbox if inbox is not None else load_inbox_config(Path(settings.config))
    # Per app, not per module: each test's app (and each server process) counts on its own.
    app_metrics = Metrics(sources=inbox.sources)
    pipelines = resolve_pipelines(inbox)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tokens, _ = ensure_admin_tokens(settings)
        url = database_url(settings)
        engine = create_engine(url, settings)
        committer = GroupCommitter(
            engine,
            flushers=settings.ingest_flushers,
            max_queued=settings.ingest_max_queued,
            wait_timeout=settings.db_timeout_seconds * 2,
            connect_timeout=settings.db_timeout_seconds,
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
            pipelines=pipelines,
        )
        committer.start()
        stop = asyncio.Event()
        worker: asyncio.Task[None] | None = None
        if run_worker_in_process:
            running = run_worker(
                settings, url, pipelines, stop, metrics=app_metrics, retention=inbox
            )
            worker = asyncio.create_task(running, name="worker")
            worker.add_done_callback(lambda task: on_worker_done(task, stop, exit_on_worker_crash))
        try:
            yield
        finally:
            stop.set()
            if worker is not None:
                await asyncio.gather(worker, return_exceptions=True)
            await committer.close()
            await engine.dispose()

    app = InboxApp(
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


class InboxApp(FastAPI):
    """FastAPI, with the ingest hot path served before FastAPI's own layers (see
    `service.api.ingest.serve_ingest`); every other request goes through FastAPI."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            state = getattr(self.state, "inbox", None)
            if state is not None and await ingest.serve_ingest(state, scope, receive, send):
                return
        await super().__call__(scope, receive, send)


def on_worker_done(task: asyncio.Task[None], stop: asyncio.Event, exit_process: bool) -> None:
    if stop.is_set() or task.cancelled() or task.exception() is None:
        return
    log.critical("worker crashed", exc_info=task.exception())
    if exit_process:
        # Stop serving too, so the process supervisor restarts the whole thing.
        signal.raise_signal(signal.SIGTERM)


def create_app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory`, as each server process of `serve --workers N` calls it."""
    run = os.environ.get(RUN_WORKER_ENV, "0") == "1"
    settings = Settings()
    # uvicorn spawns these processes afresh: without this their logs would be unformatted
    # and below WARNING lost (no delivery lines at all).
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings, run_worker_in_process=run, exit_on_worker_crash=run)
