"""Forward destinations against a real local HTTP server: retries, dead at once, timeouts."""

from __future__ import annotations

import json

import asyncpg

from tests.conftest import AppFactory
from tests.http_server import scripted_server
from tests.processing_helpers import attempts_of, deliver_until, delivery, source, wait_until


def forwarding(url: str, **extra: object) -> dict[str, object]:
    return {"sources": {"hooks": source(forward={"url": url, "timeout_seconds": 2}, **extra)}}


async def test_a_503_with_retry_after_is_retried_then_200_processes_it(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps({"id": "f1", "amount": 5}).encode()
    async with (
        scripted_server((503, {"Retry-After": "1"}), (200, {})) as server,
        worker_for(forwarding(server.url)) as client,
    ):
        accepted = await client.post("/webhooks/hooks", content=body, headers=delivery("f1"))
        await wait_until(db, "SELECT status FROM inbox_messages", "processed", 10)
    first, second = server.requests
    for attempt, request in enumerate((first, second), start=1):
        assert request.body == body
        assert request.headers["content-type"] == "application/json"
        assert request.headers["idempotency-key"] == "hooks:f1"
        assert request.headers["inbox-message-id"] == str(accepted.json()["id"])
        assert request.headers["inbox-attempt"] == str(attempt)
    assert second.at - first.at >= 1.0
    attempts = await attempts_of(db, "f1")
    assert [a["outcome"] for a in attempts] == ["retry_later", "processed"]
    assert attempts[0]["error"] == "HTTP 503: scripted failure"
    row = await db.fetchrow("SELECT attempts, locked_until FROM inbox_messages")
    assert row is not None
    assert row["attempts"] == 2
    assert row["locked_until"] is None


async def test_a_400_is_dead_at_once(worker_for: AppFactory, db: asyncpg.Connection) -> None:
    async with (
        scripted_server((400, {})) as server,
        worker_for(forwarding(server.url)) as client,
    ):
        await deliver_until(client, db, "f2", "dead", 10)
    assert len(server.requests) == 1
    (attempt,) = await attempts_of(db, "f2")
    assert attempt["outcome"] == "dead"
    assert attempt["error_type"] == "ForwardRejected"


async def test_connection_errors_and_timeouts_are_retried(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # Port 1 refuses connections; two attempts later the message is dead, never lost.
    cfg = forwarding("http://127.0.0.1:1/events", max_attempts=2)
    async with worker_for(cfg) as client:
        await deliver_until(client, db, "f3", "dead", 10)
    attempts = await attempts_of(db, "f3")
    assert [a["outcome"] for a in attempts] == ["failed", "dead"]
    assert attempts[0]["error_type"] == "ForwardConnectionError"
