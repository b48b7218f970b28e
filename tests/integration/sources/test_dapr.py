"""The dapr kind over HTTP on a real database: SUCCESS for new and duplicate, DROP for junk,
the problem when configured to reject."""

from __future__ import annotations

import json

import asyncpg

from tests.conftest import AppFactory
from tests.integration.sources.rows import post_twice
from tests.senders.dapr import CONFIG, HEADERS, envelope


async def count(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


async def test_accepted_and_duplicate_both_answer_success(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        first, again = await post_twice(client, "/webhooks/orders", envelope(), HEADERS)
    assert first.status_code == again.status_code == 200
    assert first.json()["status"] == again.json()["status"] == "SUCCESS"
    assert first.json()["outcome"] == "accepted"
    assert again.json()["outcome"] == "duplicate"
    row = await db.fetchrow("SELECT message_id, event_type, receive_count FROM inbox_messages")
    assert row is not None
    assert row["message_id"] == '["checkout","5929aaac-a5e2-4ca1-859c-edfe73f11565"]'
    assert row["event_type"] == "com.dapr.event.sent"
    assert row["receive_count"] == 2


async def test_missing_id_or_malformed_body_is_dropped_and_not_recorded(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        no_id = await client.post("/webhooks/orders", content=envelope(id=None), headers=HEADERS)
        broken = await client.post("/webhooks/orders", content=b"{not json", headers=HEADERS)
        raw = await client.post(
            "/webhooks/orders",
            content=b"hello",
            headers={**HEADERS, "content-type": "text/plain"},
        )
    for response in (no_id, broken, raw):
        assert response.status_code == 200
        assert response.json()["status"] == "DROP"
    assert "'id'" in no_id.json()["detail"]
    assert await count(db) == 0


async def test_on_malformed_reject_answers_the_problem_for_dapr_to_retry(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/strict",
            content=envelope(id=None),
            headers={"content-type": "application/cloudevents+json"},
        )
    assert response.status_code == 400
    assert "'id'" in response.json()["detail"]
    assert await count(db) == 0


async def test_tampered_body_of_a_recorded_event_is_still_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # Dapr signs nothing: the token authenticates the sidecar, the pair (source, id) the event.
    async with client_for(CONFIG) as client:
        await client.post("/webhooks/orders", content=envelope("t1"), headers=HEADERS)
        changed = await client.post(
            "/webhooks/orders", content=envelope("t1", data={"orderId": 999}), headers=HEADERS
        )
    assert changed.json()["outcome"] == "duplicate"
    body = await db.fetchval("SELECT body FROM inbox_messages")
    assert json.loads(bytes(body))["data"] == {"orderId": 100}
