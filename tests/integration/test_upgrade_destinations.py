"""Upgrading to named destinations (0010) keeps every message's state and history (issue 51):
a database at 0009 holding each state the previous release writes (every status, attempts
and admin actions, a claim, a receipt), migrated, then processed by today's worker under the
old config and under one that names destinations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import current_revision, head_revision, upgrade
from service.core.settings import Settings
from tests.conftest import AppFactory
from tests.handlers import EFFECTS_DDL
from tests.pg import migrated_database
from tests.processing_helpers import WORKER_SETTINGS, source, wait_until

MESSAGES = [  # message_id, status, attempts
    ("done", "processed", 1),
    ("failing", "retrying", 2),
    ("gone", "dead", 3),
    ("set-aside", "discarded", 1),
    ("new", "pending", 0),
]

FILL = """
INSERT INTO inbox_messages (source, message_id, event_type, status, attempts, body,
                            processed_at, next_attempt_at, last_error)
SELECT 'hooks', m, 'order.created', s, a, '{}',
       CASE WHEN s = 'processed' THEN now() END, now() - interval '1 minute',
       CASE WHEN s IN ('retrying', 'dead') THEN 'RuntimeError: down' END
  FROM unnest($1::text[], $2::text[], $3::int[]) AS t(m, s, a)
"""
HISTORY = """
INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome, error_type,
                            error, actor)
SELECT m.id, g, now(), now(),
       CASE WHEN m.status = 'processed' THEN 'processed'
            WHEN m.status = 'discarded' THEN 'admin_discard' ELSE 'failed' END,
       CASE WHEN m.status IN ('retrying', 'dead') THEN 'RuntimeError' END,
       CASE WHEN m.status IN ('retrying', 'dead') THEN 'down' END, 'worker:old:1'
  FROM inbox_messages m, generate_series(1, m.attempts) AS g
"""
SNAPSHOT_MESSAGES = (
    "SELECT message_id, status, attempts, receive_count, processed_at, last_error, budget_start "
    "FROM inbox_messages ORDER BY id"
)
SNAPSHOT_ATTEMPTS = (
    "SELECT message_id, attempt, outcome, error_type, error, actor FROM inbox_attempts ORDER BY id"
)


@pytest.fixture
async def old_database(pg_server: str) -> AsyncIterator[str]:
    """A database at 0009, filled as the previous release leaves one."""
    async with migrated_database(pg_server, "0009") as (url, _):
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await conn.execute(FILL, *map(list, zip(*MESSAGES, strict=True)))
            await conn.execute(HISTORY)
            await conn.execute(
                "INSERT INTO inbox_receipts (source, message_id, received) "
                "VALUES ('hooks', 'done', 2)"
            )
            await conn.execute(EFFECTS_DDL)
        finally:
            await conn.close()
        yield url


@pytest.fixture
async def database_url(old_database: str) -> str:
    """The old database, upgraded: what `client_for` and `db` use in this module."""
    engine = create_engine(old_database, Settings(database_url="x"))
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()
    return old_database


async def snapshot(conn: asyncpg.Connection) -> tuple[list[Any], list[Any]]:
    messages = [tuple(r) for r in await conn.fetch(SNAPSHOT_MESSAGES)]
    return messages, [tuple(r) for r in await conn.fetch(SNAPSHOT_ATTEMPTS)]


async def test_the_upgrade_keeps_every_state_and_attempt(old_database: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(old_database))
    engine = create_engine(old_database, Settings(database_url="x"))
    try:
        before = await snapshot(conn)
        await upgrade(engine)
        assert await current_revision(engine) == head_revision()
        assert await snapshot(conn) == before
        assert await conn.fetchval("SELECT count(*) FROM inbox_destinations") == 0
        assert (
            await conn.fetchval("SELECT count(*) FROM inbox_attempts WHERE destination IS NOT NULL")
            == 0
        )
        assert await conn.fetchval("SELECT sum(received) FROM inbox_receipts") == 2
    finally:
        await conn.close()
        await engine.dispose()


@pytest.mark.parametrize("named", [False, True], ids=["old config", "named destinations"])
async def test_after_the_upgrade_the_unfinished_run_and_the_finished_stay(
    client_for: AppFactory, db: asyncpg.Connection, named: bool
) -> None:
    if named:
        hooks = source(
            destinations={
                "billing": {"handlers": ["tests.handlers:record_billing"]},
                "warehouse": {"handlers": ["tests.handlers:record_warehouse"]},
            }
        )
    else:
        hooks = source("tests.handlers:record_billing")
    config = {"sources": {"hooks": hooks}}
    async with client_for(config, run_worker=True, **WORKER_SETTINGS):
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 3)
    statuses = dict(await db.fetch("SELECT message_id, status FROM inbox_messages"))
    effects = await db.fetch("SELECT message_id, payload->>'by' AS by FROM effects")
    pairs = await db.fetchval("SELECT count(*) FROM inbox_destinations")
    # The retrying and pending ones ran; processed, dead and discarded ones were left alone.
    assert statuses == {
        "done": "processed",
        "failing": "processed",
        "gone": "dead",
        "set-aside": "discarded",
        "new": "processed",
    }
    ran = sorted((r["message_id"], r["by"]) for r in effects)
    if named:
        assert ran == [
            ("failing", "billing"),
            ("failing", "warehouse"),
            ("new", "billing"),
            ("new", "warehouse"),
        ]
        assert pairs == 4
    else:
        assert ran == [("failing", "billing"), ("new", "billing")]
        assert pairs == 0
