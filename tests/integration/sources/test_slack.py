"""The slack kind over HTTP on a real database: the url_verification handshake answered and
not recorded, an event recorded and Slack's retry of it a duplicate."""

from __future__ import annotations

import json
import time

import asyncpg

from tests.conftest import AppFactory
from tests.integration.sources.rows import count_rows, only_row_of_a_redelivery
from tests.senders.slack import CONFIG, callback, signed


async def test_url_verification_echoes_the_challenge_and_records_nothing(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps(
        {
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification",
        }
    ).encode()
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/slack", content=body, headers=signed(body)[1])
        unsigned = await client.post(
            "/webhooks/slack", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 200
    assert response.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    assert unsigned.status_code == 401
    assert await count_rows(db) == 0


async def test_event_is_recorded_and_a_retry_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = callback("Ev0DUP", "reaction_added")
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/slack", content=body, headers=signed(body)[1])
        # Slack's retry is signed afresh and numbered, with the same event_id.
        _, retry_headers = signed(body, timestamp=int(time.time()) + 1)
        retry_headers |= {"x-slack-retry-num": "1", "x-slack-retry-reason": "http_timeout"}
        again = await client.post("/webhooks/slack", content=body, headers=retry_headers)
    row = await only_row_of_a_redelivery(db, first, again, "Ev0DUP", "reaction_added")
    assert row["headers"]["x-slack-signature"] == "[redacted]"
