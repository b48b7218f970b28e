"""GET /admin/tail over a real database: the Server-Sent Events of accepted deliveries,
duplicates and outcomes, as the app streams them (driven over ASGI, which an httpx client
cannot do for an answer that never ends), with a worker beside the app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import asyncpg
import httpx
from fastapi import FastAPI

from service.app import create_app
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from tests.admin_seed import TOKEN
from tests.conftest import running, worker_beside
from tests.processing_helpers import (
    PROCESSED,
    WORKER_SETTINGS,
    answered,
    create_effects,
    delivery,
    source,
    wait_until,
)
from tests.tail_scenario import EVERY_KIND

CONFIG: dict[str, Any] = {
    "sources": {
        "orders": source("tests.handlers:record"),
        "flaky": source("tests.handlers:always_fail", max_attempts=2),
        "quiet": source("tests.handlers:record"),
    }
}
DEADLINE = 30.0  # seconds a test waits for the events it expects


class EventStream:
    """One GET /admin/tail, its events collected as they are streamed."""

    def __init__(self, app: FastAPI, query: list[tuple[str, str]]) -> None:
        self.app = app
        self.query = urlencode(query).encode()
        self.events: list[dict[str, Any]] = []
        self.comments: list[str] = []
        self.status: int | None = None
        self.changed = asyncio.Event()
        self._left = asyncio.Event()
        self._buffer = ""

    async def run(self) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/admin/tail",
            "raw_path": b"/admin/tail",
            "query_string": self.query,
            "root_path": "",
            "headers": [(b"host", b"inbox.test"), (b"authorization", f"Bearer {TOKEN}".encode())],
            "server": ("inbox.test", 80),
            "client": ("127.0.0.1", 50000),
        }

        async def receive() -> dict[str, Any]:
            await self._left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            else:
                self._buffer += message.get("body", b"").decode()
                while "\n\n" in self._buffer:
                    block, self._buffer = self._buffer.split("\n\n", 1)
                    self._read(block)
            self.changed.set()

        await self.app(scope, receive, send)

    def _read(self, block: str) -> None:
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if block.startswith(":"):
            self.comments.append(block[2:])
        else:
            event = json.loads(fields["data"])
            assert event["kind"] == fields["event"]
            self.events.append(event)

    async def wait_for(self, check: Callable[[], bool], what: str) -> None:
        async with asyncio.timeout(DEADLINE):
            while not check():
                self.changed.clear()
                try:
                    await asyncio.wait_for(self.changed.wait(), 1)
                except TimeoutError:
                    continue
        assert check(), what

    def leave(self) -> None:
        self._left.set()

    def seen(self) -> list[tuple[str, str, str]]:
        return [(e["kind"], e["source"], e["message_id"]) for e in self.events]


@asynccontextmanager
async def streaming(
    app: FastAPI, query: list[tuple[str, str]] | None = None
) -> AsyncIterator[EventStream]:
    stream = EventStream(app, query or [])
    task = asyncio.create_task(stream.run())
    await stream.wait_for(lambda: "following" in stream.comments, "the stream positioned")
    assert stream.status == 200
    try:
        yield stream
    finally:
        stream.leave()
        async with asyncio.timeout(DEADLINE):
            await task


@asynccontextmanager
async def inbox(
    database_url: str, data_dir: Path
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    settings = Settings(
        database_url=database_url, data_dir=data_dir, admin_tokens=[TOKEN], **WORKER_SETTINGS
    )
    app = create_app(settings, parse_inbox_config(CONFIG))
    async with running(app) as client, worker_beside(app):
        yield app, client


async def deliver(
    client: httpx.AsyncClient, name: str, message_id: str, event_type: str = "order.created"
) -> str:
    path = f"/webhooks/{name}"
    return answered(
        await client.post(path, content=b"{}", headers=delivery(message_id, event_type))
    )


async def test_the_tail_streams_each_delivery_duplicate_and_outcome_as_it_happens(
    database_url: str, data_dir: Path, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    async with inbox(database_url, data_dir) as (app, client):
        await deliver(client, "orders", "before-the-tail")
        await wait_until(db, PROCESSED, 1)
        async with streaming(app) as stream:
            assert await deliver(client, "orders", "o-1") == "accepted"
            # Once it is processed, so that the duplicate is counted on its row (one that
            # comes while the handler holds the row is kept aside, and shown without a count).
            await stream.wait_for(
                lambda: ("processed", "orders", "o-1") in stream.seen(), "o-1 processed"
            )
            assert await deliver(client, "orders", "o-1") == "duplicate"
            assert await deliver(client, "flaky", "f-1", "payment.failed") == "accepted"
            expected = EVERY_KIND
            await stream.wait_for(
                lambda: set(expected) <= set(stream.seen()), f"{expected} in {stream.seen()}"
            )
        events = {(e["kind"], e["message_id"]): e for e in stream.events}
        assert all(e["message_id"] != "before-the-tail" for e in stream.events)
        assert sorted(stream.seen()) == sorted(expected), stream.events  # each once
        row = await db.fetchval("SELECT id FROM inbox_messages WHERE message_id = 'o-1'")
        assert events["accepted", "o-1"]["id"] == row
        assert events["accepted", "o-1"]["event_type"] == "order.created"
        assert events["duplicate", "o-1"]["deliveries"] == 2
        assert events["processed", "o-1"]["attempt"] == 1
        failed, dead = events["failed", "f-1"], events["dead", "f-1"]
        assert (failed["attempt"], dead["attempt"]) == (1, 2)
        for failure in (failed, dead):
            assert failure["error_type"] == "ValueError"
            assert failure["error"] == "downstream says no"
            assert failure["event_type"] == "payment.failed"


async def test_the_tail_shows_only_what_its_filters_ask_for(
    database_url: str, data_dir: Path, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    async with inbox(database_url, data_dir) as (app, client):
        query = [
            ("source", "flaky"),
            ("source", "orders"),
            ("status", "accepted"),
            ("status", "dead"),
            ("event_type", "payment.*"),
        ]
        async with streaming(app, query) as narrow, streaming(app) as everything:
            await deliver(client, "quiet", "q-1", "payment.made")  # another source
            await deliver(client, "orders", "o-2", "order.created")  # another event type
            await deliver(client, "orders", "o-3", "payment.made")
            await deliver(client, "orders", "o-3", "payment.made")  # a duplicate
            await deliver(client, "flaky", "f-2", "payment.failed")
            await everything.wait_for(
                lambda: (
                    ("dead", "flaky", "f-2") in everything.seen()
                    and ("processed", "orders", "o-3") in everything.seen()
                    and ("processed", "quiet", "q-1") in everything.seen()
                ),
                f"everything in {everything.seen()}",
            )
            await narrow.wait_for(
                lambda: ("dead", "flaky", "f-2") in narrow.seen(), f"dead in {narrow.seen()}"
            )
        assert sorted(narrow.seen()) == [
            ("accepted", "flaky", "f-2"),
            ("accepted", "orders", "o-3"),
            ("dead", "flaky", "f-2"),
        ]


async def test_a_filter_the_api_does_not_know_is_refused(database_url: str, data_dir: Path) -> None:
    async with inbox(database_url, data_dir) as (_, client):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        response = await client.get("/admin/tail?status=pending", headers=headers)
        assert response.status_code == 422
        response = await client.get("/admin/tail?source=Not%20A%20Source", headers=headers)
        assert response.status_code == 422
