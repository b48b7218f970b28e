"""Faults on the ingest path: the database going away and coming back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from service.core.db import create_engine
from service.core.migrations import upgrade
from service.core.settings import Settings
from tests.conftest import running
from tests.pg import EmbeddedServer

CONFIG = {"sources": {"s": {"kind": "generic", "id_header": "x-id"}}}


@pytest.fixture(scope="module")
def own_server() -> Iterator[EmbeddedServer]:
    """A server of this module's own, since these tests stop it."""
    server = EmbeddedServer()
    yield server
    server.close()


@pytest.fixture
async def own_url(own_server: EmbeddedServer) -> str:
    engine = create_engine(own_server.url, Settings(database_url="x"))
    await upgrade(engine)
    async with engine.begin() as conn:
        from sqlalchemy import text

        await conn.execute(text("TRUNCATE inbox_messages CASCADE"))
    await engine.dispose()
    return own_server.url


async def test_database_down_is_503_with_retry_after_then_recovers(
    own_server: EmbeddedServer, own_url: str
) -> None:
    from service.app import create_app
    from service.sources.config_file import parse_inbox_config

    app = create_app(
        Settings(database_url=own_url, db_timeout_seconds=2), parse_inbox_config(CONFIG)
    )
    async with running(app) as client:
        before = await client.post("/webhooks/s", content=b"a", headers={"x-id": "before"})
        assert before.json()["status"] == "accepted"

        await asyncio.to_thread(own_server.stop)
        try:
            started = time.monotonic()
            down = await client.post("/webhooks/s", content=b"a", headers={"x-id": "during"})
            elapsed = time.monotonic() - started
            assert down.status_code == 503
            assert down.headers["content-type"] == "application/problem+json"
            assert int(down.headers["retry-after"]) > 0
            assert elapsed < 10, "a down database must be answered quickly, not hang"
            not_ready = await client.get("/readyz")
            assert not_ready.status_code == 503
        finally:
            await asyncio.to_thread(own_server.start)

        # The same running app, without a restart, accepts again; "during" was never recorded.
        after = await client.post("/webhooks/s", content=b"a", headers={"x-id": "during"})
        assert after.json()["status"] == "accepted"
        again = await client.post("/webhooks/s", content=b"a", headers={"x-id": "before"})
        assert again.json()["status"] == "duplicate"
        assert (await client.get("/readyz")).status_code == 200
