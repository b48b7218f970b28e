"""Alerts per issue, with a real worker and a scripted webhook: one notice when an issue opens
or reopens, however many failures are behind it, and none for an ignored issue."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import create_engine
from service.core.settings import Settings
from service.sources.config import AlertsConfig
from service.worker.issue_alerts import issue_alert_pass
from tests import handlers
from tests.admin_seed import AUTH, TOKEN
from tests.conftest import AppFactory
from tests.http_server import ScriptedServer, scripted_server
from tests.processing_helpers import source, wait_until

DEAD = "SELECT count(*) FROM inbox_messages WHERE status = 'dead'"
INSERT = (
    "INSERT INTO inbox_messages (source, message_id, event_type, body) VALUES ($1, $2, $3, '{}')"
)
# Three causes: RuntimeError (while `sync_fail` is set), KeyError and ValueError.
CAUSES = {
    "charge.succeeded": "RuntimeError",
    "refund.created": "KeyError",
    "dispute.x": "ValueError",
}


def three_causes(**extra: Any) -> dict[str, Any]:
    hooks = source(
        handler=[
            {"target": "tests.handlers:sync_switch", "event_types": ["charge.*"]},
            {"target": "tests.handlers:fail_on_missing_field", "event_types": ["refund.*"]},
            {"target": "tests.handlers:always_fail", "event_types": ["dispute.*"]},
        ],
        max_attempts=1,
    )
    return {"sources": {"hooks": hooks}, **extra}


async def insert(db: asyncpg.Connection, event_type: str, prefix: str, count: int) -> None:
    await db.executemany(INSERT, [("hooks", f"{prefix}{n}", event_type) for n in range(count)])


def issue_notices(server: ScriptedServer) -> list[dict[str, Any]]:
    bodies = [json.loads(r.body) for r in server.requests]
    return [b for b in bodies if str(b.get("event", "")).startswith("issue_")]


async def notices_settle(server: ScriptedServer, expected: int) -> list[dict[str, Any]]:
    """The issue notices once `expected` arrived and a few more passes (0.5 s apart) sent none."""
    async with asyncio.timeout(30):
        while len(issue_notices(server)) < expected:
            await asyncio.sleep(0.1)
    await asyncio.sleep(3)
    return issue_notices(server)


async def test_one_notice_per_issue_opened_and_reopened_and_none_when_ignored(
    worker_for: AppFactory, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(handlers.state, "sync_fail", True)
    async with scripted_server() as hook:
        alerts = {"webhooks": [hook.url], "interval_seconds": 1, "format": "json"}
        config = three_causes(alerts=alerts)
        async with worker_for(config, worker_alerts=True, admin_tokens=TOKEN) as client:
            for n, event_type in enumerate(CAUSES):
                await insert(db, event_type, f"m{n}-", 40)
            await wait_until(db, DEAD, 120, 30)
            opened = await notices_settle(hook, 3)
            assert len(opened) == 3  # 120 failures, 3 causes
            assert {n["event"] for n in opened} == {"issue_opened"}
            assert sorted(n["error_type"] for n in opened) == sorted(CAUSES.values())
            by_type = {n["error_type"]: n for n in opened}
            charge = by_type["RuntimeError"]
            assert charge["source"] == "hooks"
            assert charge["handler"] == "tests.handlers:sync_switch"
            assert charge["sample_error"] == "sync handler failure"
            assert charge["failed_attempts"] >= 1
            assert "opened on source `hooks`" in charge["text"]
            assert "RuntimeError" in charge["text"]
            assert "sync handler failure" in charge["text"]

            resolved = await client.post(
                f"/admin/issues/{charge['fingerprint']}/resolve",
                json={"operator": "ana"},
                headers=AUTH,
            )
            assert resolved.status_code == 200, resolved.text
            refund = by_type["KeyError"]["fingerprint"]
            ignored = await client.post(
                f"/admin/issues/{refund}/ignore", json={"operator": "ana"}, headers=AUTH
            )
            assert ignored.status_code == 200, ignored.text

            await insert(db, "charge.succeeded", "again-", 10)
            await insert(db, "refund.created", "ignored-", 10)
            await wait_until(db, DEAD, 140, 30)
            after = await notices_settle(hook, 4)
    assert len(after) == 4
    reopened = after[-1]
    assert reopened["event"] == "issue_reopened"
    assert reopened["fingerprint"] == charge["fingerprint"]
    assert reopened["failed_attempts"] > charge["failed_attempts"]
    assert "reopened on source `hooks`" in reopened["text"]
    assert all(n["fingerprint"] != refund for n in after[3:])  # ignored: never announced


@pytest.fixture
async def engine(database_url: str) -> Any:
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_two_processes_passing_at_once_send_each_notice_once(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(handlers.state, "sync_fail", True)
    async with scripted_server() as hook, worker_for(three_causes()):
        for n, event_type in enumerate(CAUSES):
            await insert(db, event_type, f"p{n}-", 5)
        await wait_until(db, DEAD, 15, 30)
        config = AlertsConfig.model_validate({"webhooks": [hook.url], "interval_seconds": 60})
        async with httpx.AsyncClient() as http:
            passes = [issue_alert_pass(engine, http, config, ["hooks"]) for _ in range(4)]
            counts = await asyncio.gather(*passes)
            assert sum(counts) == 3
            assert await issue_alert_pass(engine, http, config, ["hooks"]) == 0
    texts = [json.loads(r.body)["text"] for r in hook.requests]
    assert len(texts) == 3
    assert all(set(json.loads(r.body)) == {"text"} for r in hook.requests)  # slack format
    assert all(" opened on source `hooks`" in t for t in texts)
