"""What the provider integration tests read back from the inbox table."""

from __future__ import annotations

import json
from typing import Any

import asyncpg


async def count_rows(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


async def only_row(db: asyncpg.Connection) -> dict[str, Any]:
    rows = await db.fetch("SELECT * FROM inbox_messages")
    assert len(rows) == 1
    row = dict(rows[0])
    row["headers"] = json.loads(row["headers"])
    return row
