"""Sync mode: handlers run in the ingest transaction; the answer says what committed."""

from __future__ import annotations

import asyncpg

import tests.handlers as handlers
from tests.conftest import AppFactory
from tests.processing_helpers import attempts_of, config, create_effects, delivery

SYNC = config("tests.handlers:sync_switch", mode="sync")


async def test_sync_success_commits_row_and_effect_before_the_200(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    async with client_for(SYNC) as client:
        response = await client.post("/webhooks/hooks", content=b'{"a": 1}', headers=delivery("s1"))
    assert response.status_code == 200
    reply = response.json()
    assert reply["status"] == "processed"
    assert reply["message_id"] == "s1"
    row = await db.fetchrow("SELECT id, status, attempts, processed_at FROM inbox_messages")
    assert row is not None
    assert (row["id"], row["status"], row["attempts"]) == (reply["id"], "processed", 1)
    assert row["processed_at"] is not None
    effect = await db.fetchrow("SELECT inbox_id, attempt FROM effects")
    assert effect is not None
    assert (effect["inbox_id"], effect["attempt"]) == (reply["id"], 1)
    (attempt,) = await attempts_of(db, "s1")
    assert attempt["outcome"] == "processed"
    assert attempt["actor"].startswith("sync:")


async def test_sync_failure_records_nothing_and_redelivery_runs_it_again(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    async with client_for(SYNC) as client:
        handlers.state["sync_fail"] = True
        try:
            failed = await client.post("/webhooks/hooks", content=b"{}", headers=delivery("s2"))
        finally:
            handlers.state["sync_fail"] = False
        assert failed.status_code == 500
        assert failed.headers["content-type"] == "application/problem+json"
        assert "nothing was recorded" in failed.json()["detail"]
        assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0
        assert await db.fetchval("SELECT count(*) FROM effects") == 0
        assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0

        again = await client.post("/webhooks/hooks", content=b"{}", headers=delivery("s2"))
        assert again.status_code == 200
        assert again.json()["status"] == "processed"

        duplicate = await client.post("/webhooks/hooks", content=b"{}", headers=delivery("s2"))
        assert duplicate.status_code == 200
        assert duplicate.json() == {"status": "duplicate", "message_id": "s2"}
    assert await db.fetchval("SELECT count(*) FROM effects") == 1
    assert await db.fetchval("SELECT receive_count FROM inbox_messages") == 2


async def test_sync_mode_does_not_wake_workers(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    await db.execute("LISTEN webhook_inbox")
    notified: list[str] = []
    await db.add_listener("webhook_inbox", lambda *args: notified.append(args[3]))
    async with client_for(SYNC) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("s3"))
    assert notified == []


async def test_sync_rows_staged_with_insert_commit_before_the_200_or_not_at_all(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    async with client_for(config("tests.handlers:insert_effect_or_fail", mode="sync")) as client:
        good = await client.post("/webhooks/hooks", content=b'{"a": 1}', headers=delivery("g1"))
        bad = await client.post("/webhooks/hooks", content=b'{"a": 2}', headers=delivery("bad1"))
    assert good.status_code == 200
    assert good.json()["status"] == "processed"
    assert bad.status_code == 500
    effects = await db.fetch("SELECT inbox_id, message_id, payload FROM effects")
    assert [(e["inbox_id"], e["message_id"], e["payload"]) for e in effects] == [
        (good.json()["id"], "g1", '{"a": 1}')
    ]
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 1
