"""Named destinations (issue 51): each destination of a message has its own attempts, status
and dead letters; one that fails is retried alone, one that is done never runs again."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from tests.conftest import AppFactory
from tests.processing_helpers import delivery, source, wait_until

BILLING = {"handlers": ["tests.handlers:record_billing"]}
WAREHOUSE = {"handlers": ["tests.handlers:record_warehouse"]}


def fanned(**destinations: dict[str, Any]) -> dict[str, Any]:
    return {"sources": {"hooks": source(destinations=destinations)}}


async def effects_by(db: asyncpg.Connection) -> list[tuple[str, str, int]]:
    rows = await db.fetch("SELECT message_id, payload, attempt FROM effects ORDER BY id")
    return sorted((r["message_id"], json.loads(r["payload"])["by"], r["attempt"]) for r in rows)


async def destination_states(db: asyncpg.Connection, message_id: str) -> dict[str, Any]:
    rows = await db.fetch(
        "SELECT d.destination, d.status, d.attempts FROM inbox_destinations d "
        "JOIN inbox_messages m ON m.id = d.message_id WHERE m.message_id = $1",
        message_id,
    )
    return {r["destination"]: (r["status"], r["attempts"]) for r in rows}


async def destination_attempts(db: asyncpg.Connection, message_id: str) -> list[tuple[Any, ...]]:
    rows = await db.fetch(
        "SELECT a.destination, a.attempt, a.outcome FROM inbox_attempts a "
        "JOIN inbox_messages m ON m.id = a.message_id WHERE m.message_id = $1 ORDER BY a.id",
        message_id,
    )
    return [tuple(r) for r in rows]


async def test_a_failing_destination_is_retried_alone_and_every_effect_applies_once(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = fanned(
        billing=BILLING,
        disputes={"handlers": ["tests.handlers:record_disputes_failing_three_times"]},
        warehouse=WAREHOUSE,
    )
    async with worker_for(config) as client:
        sent = await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
        assert sent.status_code == 200
        await wait_until(db, "SELECT status FROM inbox_messages", "processed")
    assert await effects_by(db) == [
        ("m-1", "billing", 1),
        ("m-1", "disputes", 4),
        ("m-1", "warehouse", 1),
    ]
    assert await destination_states(db, "m-1") == {
        "billing": ("processed", 1),
        "disputes": ("processed", 4),
        "warehouse": ("processed", 1),
    }
    assert await destination_attempts(db, "m-1") == [
        ("billing", 1, "processed"),
        ("disputes", 1, "failed"),
        ("warehouse", 1, "processed"),
        ("disputes", 2, "failed"),
        ("disputes", 3, "failed"),
        ("disputes", 4, "processed"),
    ]
    assert await db.fetchval("SELECT attempts FROM inbox_messages") == 4
