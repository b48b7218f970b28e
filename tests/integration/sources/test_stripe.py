"""The stripe kind over HTTP on a real database: an event recorded with its type, and Stripe's
freshly signed retry of it a duplicate."""

from __future__ import annotations

import time

import asyncpg

from tests.conftest import AppFactory
from tests.integration.sources.rows import only_row
from tests.senders.stripe import CONFIG, event, generate_header, headers


async def test_event_is_recorded_with_its_type_and_redelivery_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = event("evt_dup", "invoice.paid")
    first_header = generate_header(body)
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/payments", content=body, headers=headers(first_header))
        # Stripe signs each attempt afresh: a retry has a new t= and signature, same event id.
        retry_header = generate_header(body, timestamp=int(time.time()) + 1)
        again = await client.post("/webhooks/payments", content=body, headers=headers(retry_header))
    assert first.json()["status"] == "accepted"
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate", "message_id": "evt_dup"}
    row = await only_row(db)
    assert row["event_type"] == "invoice.paid"
    assert row["receive_count"] == 2
