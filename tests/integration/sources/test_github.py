"""The github kind over HTTP on a real database: an event recorded, its redelivery a duplicate."""

from __future__ import annotations

import asyncpg

from tests.conftest import AppFactory
from tests.integration.sources.rows import only_row_of_a_redelivery, post_twice
from tests.senders.github import CONFIG, signed


async def test_event_with_action_is_recorded_and_redelivery_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed({"action": "opened", "issue": {"number": 1}})
    async with client_for(CONFIG) as client:
        first, again = await post_twice(client, "/webhooks/gh", body, headers)
    delivery_id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    row = await only_row_of_a_redelivery(db, first, again, delivery_id, "issues.opened")
    assert row["headers"]["x-hub-signature-256"] == "[redacted]"
    assert row["headers"]["x-github-event"] == "issues"
