"""Forwarding from a real `webhook-inbox worker` process: a killed worker's lease is retried."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import AppFactory
from tests.http_server import HANG, scripted_server
from tests.processing_helpers import attempts_of, source, wait_until
from tests.worker_process import crash, start_worker, wait_listening


@pytest.mark.slow
async def test_a_lease_abandoned_by_a_killed_worker_is_retried(
    database_url: str, db: asyncpg.Connection, tmp_path: Path, worker_for: AppFactory
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
        # The lease (timeout 1 s + margin 3 s) must outlast the time from the forward's arrival
        # to the kill, which a loaded machine stretched past 1.5 s: the doomed worker then
        # took its own expired claim again before it died.
        worker = start_worker(
            database_url, toml, tmp_path, "doomed", INBOX_WORKER_LEASE_MARGIN_SECONDS="3"
        )
        try:
            await wait_listening(db, 1)
            await db.execute(
                "INSERT INTO inbox_messages (source, message_id, body, content_type) "
                "VALUES ('hooks', 'lease-1', '\\x7b7d', 'application/json')"
            )
            await db.execute("NOTIFY webhook_inbox, 'hooks'")
            await asyncio.wait_for(server.arrived.wait(), 20)
            crash(worker)
        finally:
            if worker.poll() is None:
                worker.kill()
        row = await db.fetchrow("SELECT status, attempts, locked_until FROM inbox_messages")
        assert row is not None
        assert (row["status"], row["attempts"]) == ("processing", 1)
        # A new worker takes the message over once the lease expires.
        cfg = {"sources": {"hooks": source(forward={"url": server.url, "timeout_seconds": 1})}}
        async with worker_for(cfg, worker_lease_margin_seconds=0.5):
            await wait_until(db, "SELECT status FROM inbox_messages", "processed", 15)
    first, second = server.requests
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == "hooks:lease-1"
    assert (first.headers["inbox-attempt"], second.headers["inbox-attempt"]) == ("1", "2")
    attempts = await attempts_of(db, "lease-1")
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "abandoned"), (2, "processed")]
