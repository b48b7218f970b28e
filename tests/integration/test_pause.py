"""Pausing a source's processing (issue 52 item 3): ingest keeps accepting and deduplicating,
nothing is claimed, the pause outlives a restart, and resume drains the backlog."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.admin_seed import AUTH, TOKEN
from tests.cli_runner import cli
from tests.conftest import AppFactory
from tests.processing_helpers import config, delivery, wait_until

CONFIG = config("tests.handlers:record")
PAUSE = {"operator": "Ada", "reason": "billing API down, INC-4211"}
BURST = 200


async def burst(client: httpx.AsyncClient, prefix: str, count: int = BURST) -> list[str]:
    replies = await asyncio.gather(
        *(
            client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"{prefix}-{i}"))
            for i in range(count)
        )
    )
    return [r.json()["status"] for r in replies]


async def test_a_paused_source_accepts_every_delivery_claims_none_and_resume_drains_it(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with worker_for(CONFIG, admin_tokens=[TOKEN]) as client:
        paused = await client.post("/admin/sources/hooks/pause", json=PAUSE, headers=AUTH)
        assert paused.status_code == 200, paused.text
        assert paused.json()["paused"]["operator"] == "Ada"
        assert await burst(client, "m") == ["accepted"] * BURST
        assert await burst(client, "m", 20) == ["duplicate"] * 20  # deduplicated meanwhile
        await asyncio.sleep(1.5)  # many polls and notifications of the worker
        listed = (await client.get("/admin/sources", headers=AUTH)).json()["sources"]
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0
    assert (
        await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'pending'") == BURST
    )
    (hooks,) = listed
    assert (hooks["paused"]["operator"], hooks["paused"]["reason"]) == ("Ada", PAUSE["reason"])
    assert hooks["paused"]["actor"].startswith("token:")

    # A restart (another app and worker on the database) finds it paused still.
    async with worker_for(CONFIG, admin_tokens=[TOKEN]) as client:
        await asyncio.sleep(1.0)
        assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0
        resumed = await client.post("/admin/sources/hooks/resume", headers=AUTH)
        again = await client.post("/admin/sources/hooks/resume", headers=AUTH)
        await wait_until(
            db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", BURST
        )
    assert (resumed.json()["changed"], resumed.json()["paused"]) == (True, None)
    assert again.json()["changed"] is False
    # Each once, and no attempt spent by the wait.
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == BURST
    assert await db.fetchval("SELECT max(attempts) FROM inbox_messages") == 1
    assert await db.fetchval("SELECT count(DISTINCT inbox_id) FROM effects") == BURST


async def test_pause_refuses_what_it_cannot_keep(client_for: AppFactory) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        unknown = await client.post("/admin/sources/nowhere/pause", json=PAUSE, headers=AUTH)
        no_reason = await client.post(
            "/admin/sources/hooks/pause", json={"operator": "Ada"}, headers=AUTH
        )
        empty = await client.post(
            "/admin/sources/hooks/pause", json={"operator": "", "reason": "x"}, headers=AUTH
        )
        extra = await client.post(
            "/admin/sources/hooks/pause", json={**PAUSE, "until": "tomorrow"}, headers=AUTH
        )
        listed = (await client.get("/admin/sources", headers=AUTH)).json()["sources"]
    assert unknown.status_code == 404
    assert "configured: hooks" in unknown.json()["detail"]
    for refused in (no_reason, empty, extra):
        assert refused.status_code == 422
        assert refused.headers["content-type"] == "application/problem+json"
    assert listed[0]["paused"] is None


async def test_the_command_line_pauses_and_resumes(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    toml = tmp_path / "inbox.toml"
    toml.write_text('[sources.hooks]\nkind = "generic"\nid_header = "X-Message-Id"\n')
    monkeypatch.setenv("INBOX_CONFIG", str(toml))
    paused = await cli(monkeypatch, database_url, "pause", "hooks", "--reason", "deploy")
    unknown = await cli(monkeypatch, database_url, "pause", "nope", "--reason", "x")
    assert paused.status == 0, paused.err
    assert paused.out.startswith("hooks paused by ")
    assert unknown.status == 1
    assert "no source nope is configured" in unknown.err
    row = await db.fetchrow("SELECT operator, reason, actor FROM inbox_source_pauses")
    assert (row["reason"], row["actor"].startswith("cli:")) == ("deploy", True)
    async with worker_for(CONFIG) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
        await asyncio.sleep(1.0)
        assert await db.fetchval("SELECT status FROM inbox_messages") == "pending"
        resumed = await cli(monkeypatch, database_url, "resume", "hooks", "--json")
        assert (resumed.status, resumed.json()["changed"]) == (0, True)
        await wait_until(db, "SELECT status FROM inbox_messages", "processed")


async def test_a_paused_forwarding_source_is_not_leased_either(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # Forwards are claimed by a lease (CLAIM), not by a batch's lock (LOCK_DUE): both skip it.
    forwarding = config(forward={"url": "http://127.0.0.1:9/down"})
    async with worker_for(forwarding, admin_tokens=[TOKEN]) as client:
        await client.post("/admin/sources/hooks/pause", json=PAUSE, headers=AUTH)
        assert await burst(client, "f", 5) == ["accepted"] * 5
        await asyncio.sleep(1.0)
        assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0
        await client.post("/admin/sources/hooks/resume", headers=AUTH)
        await wait_until(db, "SELECT count(*) >= 5 FROM inbox_attempts", True)  # then retried
