"""The stripe kind over HTTP on a real database: an event recorded with its type, and Stripe's
freshly signed retry of it a duplicate."""

from __future__ import annotations

import time

import asyncpg

from tests.conftest import AppFactory
from tests.integration.sources.rows import only_row_of_a_redelivery
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
    await only_row_of_a_redelivery(db, first, again, "evt_dup", "invoice.paid")
