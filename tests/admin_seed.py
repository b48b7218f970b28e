"""The admin tests' token, routes and sources, and arranging inbox rows directly in SQL."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import asyncpg

TOKEN = "admin-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# Every admin route, with 1 standing for a message id and abcdef0123456789 for a fingerprint.
ADMIN_ROUTES = [
    ("GET", "/admin/messages"),
    ("GET", "/admin/messages/export"),
    ("GET", "/admin/messages/1"),
    ("POST", "/admin/messages/1/retry"),
    ("POST", "/admin/messages/retry"),
    ("POST", "/admin/messages/actions"),
    ("GET", "/admin/messages/actions"),
    ("GET", "/admin/messages/actions/1"),
    ("POST", "/admin/messages/actions/1/resume"),
    ("POST", "/admin/messages/1/discard"),
    ("GET", "/admin/dead-letters"),
    ("GET", "/admin/dead-letters/groups"),
    ("GET", "/admin/stats"),
    ("GET", "/admin/stats/activity"),
    ("GET", "/admin/sources"),
    ("POST", "/admin/prune"),
    ("GET", "/admin/destinations"),
    ("GET", "/admin/outbox"),
    ("POST", "/admin/messages/1/destinations/billing/retry"),
    ("POST", "/admin/messages/1/destinations/billing/discard"),
    ("POST", "/admin/sources/hooks/destinations/billing/replay"),
    ("POST", "/admin/sources/hooks/pause"),
    ("POST", "/admin/sources/hooks/resume"),
    ("GET", "/admin/rejected"),
    ("GET", "/admin/tail"),
    ("GET", "/admin/consumers"),
    ("GET", "/admin/issues"),
    ("GET", "/admin/issues/abcdef0123456789"),
    ("POST", "/admin/issues/abcdef0123456789/acknowledge"),
    ("POST", "/admin/issues/abcdef0123456789/resolve"),
    ("POST", "/admin/issues/abcdef0123456789/ignore"),
    ("POST", "/admin/issues/abcdef0123456789/reopen"),
    ("POST", "/admin/issues/abcdef0123456789/retry"),
]


def route_template(path: str) -> str:
    """An ADMIN_ROUTES path as OpenAPI writes it: `/admin/messages/{id}/destinations/{name}`."""
    return (
        path.replace("/1", "/{id}")
        .replace("/destinations/billing/", "/destinations/{name}/")
        .replace("/sources/hooks/", "/sources/{source}/")
        .replace("/abcdef0123456789", "/{fingerprint}")
    )


CONFIG: dict[str, Any] = {
    "sources": {
        # Handlers (no worker runs them here) keep ingested messages pending for the admin.
        "hooks": {
            "kind": "generic",
            "id_header": "X-Message-Id",
            "event_type_header": "X-Type",
            "handlers": ["tests.handlers:record"],
        },
        "other": {
            "kind": "generic",
            "id_header": "X-Message-Id",
            "handlers": ["tests.handlers:record"],
        },
        # Named destinations, for the routes over them.
        "routed": {
            "kind": "generic",
            "id_header": "X-Message-Id",
            "destinations": {
                "billing": {"handlers": ["tests.handlers:record_billing"]},
                "warehouse": {"forward": {"url": "http://127.0.0.1:9/warehouse"}},
            },
        },
    }
}


async def seed(
    db: asyncpg.Connection,
    message_id: str,
    *,
    source: str = "hooks",
    status: str = "pending",
    event_type: str | None = None,
    age: timedelta = timedelta(0),
    received_at: datetime | None = None,
    last_received_age: timedelta | None = None,
    attempts: int = 0,
    body: bytes = b'{"hello": "world"}',
    content_type: str | None = "application/json",
    headers: dict[str, str] | None = None,
    last_error: str | None = None,
    ordering_key: str | None = None,
    searchable: bool = True,
) -> int:
    """Insert one message row and return its id; `searchable`: as a source with
    `search_payload` stores it."""
    row_id = await db.fetchval(
        """
        INSERT INTO inbox_messages (source, message_id, event_type, status, attempts,
                                    received_at, last_received_at, body, content_type,
                                    headers, last_error, processed_at, ordering_key, searchable)
        VALUES ($1, $2, $3, $4, $5,
                coalesce($6, now() - $7::interval), now() - coalesce($8, $7)::interval,
                $9, $10, $11::jsonb, $12, CASE WHEN $4 = 'processed' THEN now() END, $13, $14)
        RETURNING id
        """,
        source,
        message_id,
        event_type,
        status,
        attempts,
        received_at,
        age,
        last_received_age,
        body,
        content_type,
        json.dumps(headers or {"content-type": "application/json"}),
        last_error,
        ordering_key,
        searchable,
    )
    return int(row_id)


async def seed_in(db: asyncpg.Connection, *statuses: str) -> list[int]:
    """A message in each of `statuses` (message id `m-<status>`), their ids in that order."""
    return [await seed(db, f"m-{status}", status=status) for status in statuses]


async def seed_attempt(
    db: asyncpg.Connection,
    message: int,
    attempt: int,
    outcome: str,
    *,
    error: str | None = None,
    age: timedelta = timedelta(0),
    actor: str | None = None,
) -> None:
    await db.execute(
        """
        INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome,
                                    error_type, error, duration_ms, actor)
        VALUES ($1, $2, now() - $3::interval, now() - $3::interval, $4,
                CASE WHEN $5::text IS NULL THEN NULL ELSE 'RuntimeError' END, $5, 12.5, $6)
        """,
        message,
        attempt,
        age,
        outcome,
        error,
        actor,
    )


async def status_of(db: asyncpg.Connection, message: int) -> str:
    return str(await db.fetchval("SELECT status FROM inbox_messages WHERE id = $1", message))


def last_hour(stats: dict[str, Any]) -> tuple[int, int, int]:
    """`GET /admin/stats`' worker attempts, worker failures and admin actions of the last hour."""
    return (
        stats["attempts_last_hour"],
        stats["failures_last_hour"],
        stats["admin_actions_last_hour"],
    )
