"""Forward destinations against a real local HTTP server, including a killed worker's lease."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import AppFactory
from tests.http_server import HANG, scripted_server
from tests.processing_helpers import WORKER_SETTINGS, attempts_of, delivery, source, wait_until
from tests.worker_process import start_worker, wait_listening


def forwarding(url: str, **extra: object) -> dict[str, object]:
    return {"sources": {"hooks": source(forward={"url": url, "timeout_seconds": 2}, **extra)}}


async def test_a_503_with_retry_after_is_retried_then_200_processes_it(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps({"id": "f1", "amount": 5}).encode()
    async with (
        scripted_server((503, {"Retry-After": "1"}), (200, {})) as server,
        client_for(forwarding(server.url), run_worker=True, **WORKER_SETTINGS) as client,
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


async def test_a_400_is_dead_at_once(client_for: AppFactory, db: asyncpg.Connection) -> None:
    async with (
        scripted_server((400, {})) as server,
        client_for(forwarding(server.url), run_worker=True, **WORKER_SETTINGS) as client,
    ):
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("f2"))
        await wait_until(db, "SELECT status FROM inbox_messages", "dead", 10)
    assert len(server.requests) == 1
    (attempt,) = await attempts_of(db, "f2")
    assert attempt["outcome"] == "dead"
    assert attempt["error_type"] == "ForwardRejected"


async def test_connection_errors_and_timeouts_are_retried(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # Port 1 refuses connections; two attempts later the message is dead, never lost.
    cfg = forwarding("http://127.0.0.1:1/events", max_attempts=2)
    async with client_for(cfg, run_worker=True, **WORKER_SETTINGS) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("f3"))
        await wait_until(db, "SELECT status FROM inbox_messages", "dead", 10)
    attempts = await attempts_of(db, "f3")
    assert [a["outcome"] for a in attempts] == ["failed", "dead"]
    assert attempts[0]["error_type"] == "ForwardConnectionError"


@pytest.mark.slow
async def test_a_lease_abandoned_by_a_killed_worker_is_retried(
    database_url: str, db: asyncpg.Connection, tmp_path: Path, client_for: AppFactory
) -> None:
    async with scripted_server((HANG, {}), (200, {})) as server:
        toml = f"""
[sources.hooks]
kind = "generic"
id_header = "X-Message-Id"
backoff_base_seconds = 0.05
backoff_max_seconds = 0.1
[sources.hooks.forward]
url = "{server.url}"
timeout_seconds = 1
"""
        worker = start_worker(
            database_url, toml, tmp_path, "doomed", INBOX_WORKER_LEASE_MARGIN_SECONDS="0.5"
        )
        try:
            await wait_listening(db, 1)
            await db.execute(
                "INSERT INTO inbox_messages (source, message_id, body, content_type) "
                "VALUES ('hooks', 'lease-1', '\\x7b7d', 'application/json')"
            )
            await db.execute("NOTIFY webhook_inbox, 'hooks'")
            await asyncio.wait_for(server.arrived.wait(), 20)
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        finally:
            if worker.poll() is None:
                worker.kill()
        row = await db.fetchrow("SELECT status, attempts, locked_until FROM inbox_messages")
        assert row is not None
        assert (row["status"], row["attempts"]) == ("processing", 1)
        # A new worker takes the message over once the lease (timeout 1s + margin 0.5s) expires.
        cfg = {"sources": {"hooks": source(forward={"url": server.url, "timeout_seconds": 1})}}
        async with client_for(
            cfg, run_worker=True, worker_lease_margin_seconds=0.5, **WORKER_SETTINGS
        ):
            await wait_until(db, "SELECT status FROM inbox_messages", "processed", 15)
    first, second = server.requests
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == "hooks:lease-1"
    assert (first.headers["inbox-attempt"], second.headers["inbox-attempt"]) == ("1", "2")
    attempts = await attempts_of(db, "lease-1")
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "abandoned"), (2, "processed")]
