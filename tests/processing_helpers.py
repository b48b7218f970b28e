"""Shared helpers for the processing tests: configs, waiting on the database."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx

from tests.handlers import EFFECTS_DDL
from tests.http_server import ScriptedServer

STATUS_OF = "SELECT status FROM inbox_messages WHERE message_id = $1"

# Fast retries and polling keep the suite quick.
WORKER_SETTINGS: dict[str, Any] = {"worker_poll_seconds": 0.1, "worker_grace_seconds": 10}


def source(*handlers: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "kind": "generic",
        "id_header": "X-Message-Id",
        "event_type_header": "X-Event-Type",
        "handlers": list(handlers),
        "max_attempts": 5,
        "backoff_base_seconds": 0.05,
        "backoff_max_seconds": 0.2,
    }
    config.update(extra)
    return config


PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"


def breaker_forward(url: str, failures: int, cooldown: float) -> dict[str, Any]:
    """A forward to `url` whose circuit opens after `failures` failed calls in a row and lets
    one probe through every `cooldown` seconds."""
    return {
        "url": url,
        "timeout_seconds": 2,
        "breaker_failures": failures,
        "breaker_cooldown_seconds": cooldown,
    }


def most_calls_while_down(down_for: float, failures: int, cooldown: float) -> int:
    """The calls a breaker lets through in `down_for` seconds of outage: `failures` to open
    it, then a probe per cool-down."""
    return failures + int(down_for / cooldown) + 1


async def endpoint_back(
    endpoint: ScriptedServer,
    started: float,
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    messages: int,
) -> tuple[float, str]:
    """An outage's end: `endpoint` answers 200 again. How long it was down (since `started`,
    a monotonic time), and the app's metrics once its `messages` are all processed."""
    endpoint.script.clear()
    down_for = time.monotonic() - started
    await wait_until(db, PROCESSED, messages)
    return down_for, (await client.get("/metrics")).text


def config(*handlers: str, **extra: Any) -> dict[str, Any]:
    return {"sources": {"hooks": source(*handlers, **extra)}}


def delivery(message_id: str, event_type: str = "order.created") -> dict[str, str]:
    return {
        "x-message-id": message_id,
        "x-event-type": event_type,
        "content-type": "application/json",
    }


def answered(response: httpx.Response) -> str:
    """What ingest answered a delivery it took: `accepted` or `duplicate`."""
    assert response.status_code == 200, response.text
    status: str = response.json()["status"]
    return status


async def create_effects(db: asyncpg.Connection) -> None:
    await db.execute(EFFECTS_DDL)


async def deliver_until(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    message_id: str,
    status: str,
    timeout: float = 20.0,
) -> None:
    """Delivers `message_id` to `hooks` (an empty body), then waits until its status is `status`."""
    await client.post("/webhooks/hooks", content=b"{}", headers=delivery(message_id))
    await wait_until(db, STATUS_OF, status, timeout, message_id)


async def insert_messages(db: asyncpg.Connection, *message_ids: str) -> None:
    """Messages of source `hooks` recorded directly: before a worker starts, they are all due
    together, and land in one claimed batch if it has one claim loop (`worker_concurrency=1`;
    concurrent loops may split them, each skipping the rows another has locked)."""
    await db.executemany(
        "INSERT INTO inbox_messages (source, message_id, body) VALUES ('hooks', $1, '{}')",
        [(i,) for i in message_ids],
    )


async def wait_until(
    db: asyncpg.Connection, query: str, expected: Any, timeout: float = 20.0, *args: Any
) -> None:
    """Poll `query` until it returns `expected`, or fail with the last value seen."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = await db.fetchval(query, *args)
        if value == expected:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{query!r} is {value!r}, waited {timeout}s for {expected!r}")


async def status_of(db: asyncpg.Connection, message_id: str) -> str | None:
    status: str | None = await db.fetchval(STATUS_OF, message_id)
    return status


async def attempts_of(db: asyncpg.Connection, message_id: str) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT a.* FROM inbox_attempts a JOIN inbox_messages m ON m.id = a.message_id "
            "WHERE m.message_id = $1 ORDER BY a.id",
            message_id,
        )
    )
