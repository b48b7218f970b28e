"""Fixtures: a real PostgreSQL per session, a migrated clone per test, apps and clients on it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI

from service.app import create_app
from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import upgrade
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from service.worker.runtime import run_worker
from tests.cli_runner import logging_restored
from tests.pg import create_database, drop_database, postgres_server, with_database
from tests.processing_helpers import WORKER_SETTINGS, create_effects

if TYPE_CHECKING:
    from tests.senders.sns import FakeFetcher


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
async def template_db(pg_server: str) -> AsyncIterator[str]:
    """A database migrated to head once; each test clones it (commits can't be rolled back)."""
    name = await create_database(pg_server)
    engine = create_engine(with_database(pg_server, name), Settings(database_url="x"))
    await upgrade(engine)
    await engine.dispose()
    yield name
    await drop_database(pg_server, name)


@pytest.fixture
async def database_url(pg_server: str, template_db: str) -> AsyncIterator[str]:
    name = await create_database(pg_server, template=template_db)
    yield with_database(pg_server, name)
    await drop_database(pg_server, name)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the test's database, for arranging and asserting rows."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    yield conn
    await conn.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


AppFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on `app`, with its lifespan started and stopped around the block."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://inbox.test") as client:
            yield client


@asynccontextmanager
async def worker_beside(app: FastAPI, *, with_alerts: bool = False) -> AsyncIterator[None]:
    """A worker on the app's database and sources, beside it in this event loop (as a
    processing process of `serve` runs beside the HTTP ones), counting into its metrics.
    `with_alerts`: it reads the sources file's retention and `[alerts]` too, as `serve`'s."""
    state = app.state.inbox
    stop = asyncio.Event()
    url = state.settings.database_url
    retention = state.inbox if with_alerts else None
    task = asyncio.create_task(
        run_worker(
            state.settings, url, state.pipelines, stop, metrics=state.metrics, retention=retention
        )
    )
    try:
        yield
    finally:
        stop.set()
        await task


@pytest.fixture
def client_for(database_url: str, data_dir: Path) -> AppFactory:
    """`async with client_for(config_dict, **settings) as client:` an app on the test database.

    `run_worker=True` also runs a worker beside it, as `serve` does in another process;
    `worker_alerts=True` gives that worker the sources file's retention and `[alerts]`.
    """

    @asynccontextmanager
    async def factory(
        config: dict[str, Any],
        run_worker: bool = False,
        worker_alerts: bool = False,
        **settings: Any,
    ) -> AsyncIterator[httpx.AsyncClient]:
        options: dict[str, Any] = {"database_url": database_url, "data_dir": data_dir}
        options.update(settings)
        app = create_app(Settings(**options), parse_inbox_config(config))
        async with running(app) as client:
            if not run_worker:
                yield client
                return
            async with worker_beside(app, with_alerts=worker_alerts):
                yield client

    return factory


@pytest.fixture
async def worker_for(client_for: AppFactory, db: asyncpg.Connection) -> AppFactory:
    """`client_for` with `run_worker=True` and the quick polling and retries of
    `WORKER_SETTINGS` (which `**settings` may override), on a database with the `effects`
    table the recording handlers of tests/handlers.py write."""
    await create_effects(db)

    def factory(
        config: dict[str, Any], **settings: Any
    ) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        return client_for(config, run_worker=True, **{**WORKER_SETTINGS, **settings})

    return factory


@pytest.fixture
def fetcher() -> FakeFetcher:
    """The certificate fetcher of the sns tests, unit and integration: it serves the local
    certificate and records each call."""
    # Imported when asked for: tests.senders.sns makes an RSA key as it is imported.
    from tests.senders.sns import FakeFetcher

    return FakeFetcher()


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A test that runs a command in this process (`main([...])`) configures logging on a
    stderr pytest closes after the test: the next tests get the logging they started with."""
    with logging_restored():
        yield


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own settings must not leak into tests.
    for name in list(os.environ):
        if name.startswith("INBOX_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
