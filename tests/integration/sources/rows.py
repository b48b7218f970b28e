"""What the provider integration tests read back from the inbox table, and check of it."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import httpx


async def post_twice(
    client: httpx.AsyncClient, path: str, body: bytes, headers: dict[str, str]
) -> tuple[httpx.Response, httpx.Response]:
    """A delivery and its redelivery, the same bytes and headers twice, as a provider that
    never heard the first answer sends them."""
    first = await client.post(path, content=body, headers=headers)
    return first, await client.post(path, content=body, headers=headers)


async def count_rows(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


async def only_row(db: asyncpg.Connection) -> dict[str, Any]:
    rows = await db.fetch("SELECT * FROM inbox_messages")
    assert len(rows) == 1
    row = dict(rows[0])
    row["headers"] = json.loads(row["headers"])
    return row


async def only_row_of_a_redelivery(
    db: asyncpg.Connection,
    first: httpx.Response,
    again: httpx.Response,
    message_id: str,
    event_type: str,
) -> dict[str, Any]:
    """Checks the answers to a delivery and its redelivery, the first recorded as `message_id`
    and the second a duplicate of it, and their one row: of `event_type`, received twice.
    The row is returned for the checks of the kind's own."""
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "accepted"
    assert first.json()["message_id"] == message_id
    assert again.status_code == 200, again.text
    assert again.json() == {"status": "duplicate", "message_id": message_id}
    row = await only_row(db)
    assert row["event_type"] == event_type
    assert row["receive_count"] == 2
    return row
