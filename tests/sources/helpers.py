"""Assertions the provider tests share: what a rejection looks like and what was stored."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import httpx


async def count_rows(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


async def assert_rejected(
    response: httpx.Response, db: asyncpg.Connection, status: int, detail_part: str
) -> None:
    """A problem document with `status`, naming `detail_part`, and no row recorded."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status
    assert detail_part in problem["detail"], problem["detail"]
    assert await count_rows(db) == 0


async def only_row(db: asyncpg.Connection) -> dict[str, Any]:
    rows = await db.fetch("SELECT * FROM inbox_messages")
    assert len(rows) == 1
    row = dict(rows[0])
    row["headers"] = json.loads(row["headers"])
    return row
