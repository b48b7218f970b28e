"""Forward destinations against a real local HTTP server: retries, Retry-After deferrals, dead at
once, timeouts."""

from __future__ import annotations

import json

import asyncpg

from tests.conftest import AppFactory
from tests.http_server import scripted_server
from tests.processing_helpers import attempts_of, deliver_until, delivery, source, wait_until

WAITING_FOR = "SELECT last_error LIKE $1 FROM inbox_messages"


def forwarding(url: str, **extra: object) -> dict[str, object]:
    return {"sources": {"hooks": source(forward={"url": url, "timeout_seconds": 2}, **extra)}}


async def test_a_503_or_429_with_retry_after_waits_as_asked_without_spending_an_attempt(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # One attempt in the budget: were either answer to spend it, the message would be dead.
    body = json.dumps({"id": "f1", "amount": 5}).encode()
    script = (503, {"Retry-After": "1"}), (429, {"Retry-After": "1"}), (200, {})
    async with (
        scripted_server(*script) as server,
        worker_for(forwarding(server.url, max_attempts=1)) as client,
    ):
        accepted = await client.post("/webhooks/hooks", content=body, headers=delivery("f1"))
        await wait_until(
            db, "SELECT count(*) FROM inbox_messages WHERE last_error LIKE $1", 1, 10, "%429%"
        )
        waiting = await db.fetchrow(
            "SELECT status, attempts, last_error, next_attempt_at - clock_timestamp() AS wait "
            "FROM inbox_messages"
        )
        await wait_until(db, "SELECT status FROM inbox_messages", "processed", 10)
    assert waiting is not None
    assert (waiting["status"], waiting["attempts"]) == ("pending", 0)
    assert waiting["last_error"] == (
        "ForwardFailed: HTTP 429: scripted failure (Retry-After: waiting 1s, no attempt spent)"
    )
    assert 0 < waiting["wait"].total_seconds() <= 1
    first, second, third = server.requests
    for request in (first, second, third):
        assert request.body == body
        assert request.headers["content-type"] == "application/json"
        assert request.headers["idempotency-key"] == "hooks:f1"
        assert request.headers["inbox-message-id"] == str(accepted.json()["id"])
        assert request.headers["inbox-attempt"] == "1"
    assert second.at - first.at >= 1.0
    assert third.at - second.at >= 1.0
    attempts = await attempts_of(db, "f1")
    assert [a["outcome"] for a in attempts] == ["processed"]
    row = await db.fetchrow("SELECT attempts, locked_until, last_error FROM inbox_messages")
    assert row is not None
    assert tuple(row) == (1, None, None)


async def test_a_retry_after_on_another_status_or_a_429_without_one_spends_an_attempt(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    script = (500, {"Retry-After": "1"}), (429, {}), (503, {"Retry-After": "soon"}), (200, {})
    async with (
        scripted_server(*script) as server,
        worker_for(forwarding(server.url)) as client,
    ):
        await deliver_until(client, db, "f4", "processed", 10)
    assert [r.headers["inbox-attempt"] for r in server.requests] == ["1", "2", "3", "4"]
    assert server.requests[1].at - server.requests[0].at >= 1.0
    attempts = await attempts_of(db, "f4")
    outcomes = [(a["outcome"], a["error"]) for a in attempts]
    assert outcomes == [
        ("retry_later", "HTTP 500: scripted failure"),
        ("failed", "HTTP 429: scripted failure"),
        ("failed", "HTTP 503: scripted failure"),
        ("processed", None),
    ]


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


async def test_a_named_forward_destination_waits_for_its_retry_after_alone(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    ledger = {"handlers": ["tests.handlers:record_billing"]}
    async with scripted_server((429, {"Retry-After": "1"}), (200, {})) as crm:
        hooks = source(destinations={"crm": {"forward": {"url": crm.url}}, "ledger": ledger})
        hooks["max_attempts"] = 1  # a 429 that spent crm's attempt would make it dead
        async with worker_for({"sources": {"hooks": hooks}}) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("f5"))
            await wait_until(db, "SELECT count(*) FROM effects", 1, 10)
            throttled = "destination crm: ForwardFailed: HTTP 429%"
            await wait_until(db, WAITING_FOR, True, 10, throttled)
            await wait_until(db, "SELECT status FROM inbox_messages", "processed", 10)
    assert crm.requests[1].at - crm.requests[0].at >= 1.0
    crm_rows = await db.fetch(
        "SELECT status, attempts, last_error FROM inbox_destinations WHERE destination = 'crm'"
    )
    assert [tuple(r) for r in crm_rows] == [("processed", 1, None)]
    attempts = await db.fetch("SELECT destination, outcome FROM inbox_attempts ORDER BY id")
    assert sorted(tuple(a) for a in attempts) == [("crm", "processed"), ("ledger", "processed")]
    assert await db.fetchval("SELECT count(*) FROM effects") == 1
