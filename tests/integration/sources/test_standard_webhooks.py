"""The standard-webhooks kind over HTTP on a real database, with requests signed by the
`standardwebhooks` library: recorded with its type, then a duplicate."""

from __future__ import annotations

import asyncpg

from tests.conftest import AppFactory
from tests.senders.standard_webhooks import BODY, CONFIG, NEW_SECRET, signed_request


async def test_library_signed_request_is_accepted_with_its_type(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(NEW_SECRET, "msg_1", BODY)
        )
        again = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(NEW_SECRET, "msg_1", BODY)
        )
    assert response.json()["status"] == "accepted"
    assert again.json() == {"status": "duplicate", "message_id": "msg_1"}
    assert await db.fetchval("SELECT event_type FROM inbox_messages") == "invoice.paid"
