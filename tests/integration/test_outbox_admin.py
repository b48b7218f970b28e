"""Operators see outgoing messages as they see incoming ones (issue 65): the admin API, the
command line and retention, by endpoint and status, with attempts and errors; retry,
bulk retry with a dry-run count, pause; pruning never within an endpoint's key floor."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from service.core.db import create_engine
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from service.worker.retention import prune
from tests.admin_seed import AUTH, TOKEN, seed
from tests.cli_runner import cli
from tests.conftest import AppFactory
from tests.http_server import scripted_server
from tests.processing_helpers import wait_until

ENDPOINT = {"timeout_seconds": 2, "backoff_base_seconds": 0.05, "backoff_max_seconds": 0.2}
STAGE = """
INSERT INTO inbox_messages (source, message_id, body, content_type)
VALUES ('outbox:crm', $1, '{}', 'application/json')
"""
STATUS = "SELECT status FROM inbox_messages WHERE message_id = $1"


def with_crm(url: str) -> dict[str, object]:
    return {"endpoints": {"crm": {"url": url, **ENDPOINT}}}


async def test_a_dead_outgoing_message_is_listed_counted_and_retried_by_endpoint(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # A 400 is a refusal retrying cannot fix: dead at once; after a fix, retried and sent.
    async with (
        scripted_server((400, {})) as crm,
        worker_for(with_crm(crm.url), admin_tokens=[TOKEN]) as client,
    ):
        await db.execute(STAGE, "refused")
        await db.execute("NOTIFY webhook_inbox")
        await wait_until(db, STATUS, "dead", 10, "refused")
        endpoints = (await client.get("/admin/outbox", headers=AUTH)).json()["endpoints"]
        dead = await client.get(
            "/admin/dead-letters", params={"source": "outbox:crm"}, headers=AUTH
        )
        counted = await client.post(
            "/admin/messages/retry",
            json={"source": "outbox:crm", "dry_run": True},
            headers=AUTH,
        )
        (item,) = dead.json()["items"]
        detail = (await client.get(f"/admin/messages/{item['id']}", headers=AUTH)).json()
        toml = tmp_path / "inbox.toml"
        toml.write_text(f'[endpoints.crm]\nurl = "{crm.url}"\n')
        monkeypatch.setenv("INBOX_CONFIG", str(toml))
        listed = await cli(monkeypatch, database_url, "outbox")
        retried = await cli(
            monkeypatch, database_url, "messages", "bulk-retry", "--source", "outbox:crm"
        )
        await db.execute("NOTIFY webhook_inbox")
        await wait_until(db, STATUS, "processed", 10, "refused")
    (crm_info,) = endpoints
    assert crm_info["name"] == "crm"
    assert crm_info["source"] == "outbox:crm"
    assert crm_info["url"] == crm.url
    assert crm_info["signed"] is False
    assert crm_info["counts"] == {"dead": 1}
    assert item["message_id"] == "refused"
    assert item["last_error"] == "ForwardRejected: HTTP 400: scripted failure"
    assert [a["error_type"] for a in detail["attempts"]] == ["ForwardRejected"]
    assert counted.json()["matched"] == 1
    assert listed.status == 0, listed.err
    header, row = listed.out.splitlines()[:2]
    assert header.split() == [
        "ENDPOINT",
        "PENDING",
        "PROCESSED",
        "RETRYING",
        "DEAD",
        "DISCARDED",
        "OLDEST",
        "UNSENT",
        "BREAKER",
        "PAUSED",
    ]
    assert row.split()[:6] == ["crm", "0", "0", "0", "1", "0"]
    assert retried.status == 0, retried.err
    assert [r.headers["idempotency-key"] for r in crm.requests] == ["refused", "refused"]


async def test_a_paused_endpoint_holds_its_messages_until_resumed(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with (
        scripted_server() as crm,
        worker_for(with_crm(crm.url), admin_tokens=[TOKEN]) as client,
    ):
        paused = await client.post(
            "/admin/sources/outbox:crm/pause",
            json={"operator": "ada", "reason": "crm migrating"},
            headers=AUTH,
        )
        assert paused.status_code == 200, paused.text
        await db.execute(STAGE, "held")
        await db.execute("NOTIFY webhook_inbox")
        listed = (await client.get("/admin/outbox", headers=AUTH)).json()["endpoints"]
        unknown = await client.post(
            "/admin/sources/outbox:nowhere/pause",
            json={"operator": "ada", "reason": "x"},
            headers=AUTH,
        )
        assert await db.fetchval(STATUS, "held") == "pending"
        await client.post("/admin/sources/outbox:crm/resume", headers=AUTH)
        await wait_until(db, STATUS, "processed", 10, "held")
    assert listed[0]["paused"]["reason"] == "crm migrating"
    assert unknown.status_code == 404
    assert "configured: outbox:crm" in unknown.json()["detail"]
    assert len(crm.requests) == 1


async def test_pruning_keeps_an_endpoints_keys_for_its_floor(
    database_url: str, db: asyncpg.Connection
) -> None:
    day = timedelta(days=1)
    for name, age in (("two-days", 2 * day), ("four-days", 4 * day)):
        await seed(db, name, source="outbox:crm", status="processed", age=age)
    await seed(db, "gone-endpoint", source="outbox:old", status="processed", age=4 * day)
    raw = {
        "endpoints": {"crm": {"url": "http://127.0.0.1:1/", "keep_keys_days": 3}},
        "retention": {"processed_days": 1},
    }
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        report = await prune(engine, parse_inbox_config(raw))
    finally:
        await engine.dispose()
    left = {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}
    # Past `processed_days` but within the 3-day floor: kept. A removed endpoint's rows get the
    # longest floor of any source.
    assert left == {"two-days", "gone-endpoint"}
    assert report.by_source == {"outbox:crm": 1}
