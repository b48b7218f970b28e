"""The pubsub kind over HTTP on a real database: an OIDC-authenticated push recorded with its
type, its redelivery a duplicate."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg

from tests.conftest import AppFactory
from tests.senders.pubsub import bearer, config, oidc, push_body, signing_key


async def test_oidc_push_is_accepted_then_duplicate(
    client_for: AppFactory, db: asyncpg.Connection, tmp_path: Path
) -> None:
    headers = bearer(oidc(signing_key()))
    async with client_for(config(tmp_path)) as client:
        first = await client.post("/webhooks/push", content=push_body(), headers=headers)
        again = await client.post("/webhooks/push", content=push_body(), headers=headers)
    assert first.status_code == 200, first.text
    assert first.json()["message_id"] == "2070443601311540"
    assert again.json() == {"status": "duplicate", "message_id": "2070443601311540"}
    row = await db.fetchrow("SELECT event_type, headers FROM inbox_messages")
    assert row is not None
    assert row["event_type"] == "order.created"
    assert json.loads(row["headers"])["authorization"] == "[redacted]"
