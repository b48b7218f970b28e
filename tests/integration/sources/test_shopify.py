"""The shopify kind over HTTP on a real database: an order recorded, a retry a duplicate, and
an XML webhook stored untouched."""

from __future__ import annotations

import asyncpg

from tests.conftest import AppFactory
from tests.integration.sources.rows import only_row, only_row_of_a_redelivery, post_twice
from tests.senders.shopify import CONFIG, ORDER, signed


async def test_order_is_recorded_and_a_retry_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed(ORDER)
    async with client_for(CONFIG) as client:
        first, again = await post_twice(client, "/webhooks/shop", body, headers)
    webhook_id = "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
    row = await only_row_of_a_redelivery(db, first, again, webhook_id, "orders/create")
    assert row["headers"]["x-shopify-hmac-sha256"] == "[redacted]"


async def test_xml_format_webhook_is_accepted_untouched(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed(b"<?xml version='1.0'?><order><id>1</id></order>")
    headers["content-type"] = "application/xml"
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/shop", content=body, headers=headers)
    assert response.json()["status"] == "accepted"
    assert bytes((await only_row(db))["body"]) == body
