"""Alembic migrations upgrade and downgrade cleanly on a real database, one migrator at a time,
however long another one takes."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy import text

from service.core import db as db_module
from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import (
    MIGRATION_LOCK,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from service.core.settings import Settings
from service.serve import migrate
from tests.pg import LOCK_WAITERS, create_database, drop_database, with_database
from tests.processing_helpers import wait_until


async def tables(url: str) -> set[str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT tablename FROM pg_tables "
            "WHERE schemaname = 'public' AND tablename LIKE 'inbox%'"
        )
    finally:
        await conn.close()
    return {r["tablename"] for r in rows}


async def test_upgrade_downgrade_upgrade(pg_server: str) -> None:
    name = await create_database(pg_server)
    url = with_database(pg_server, name)
    engine = create_engine(url, Settings(database_url="x"))
    try:
        await upgrade(engine)
        assert await current_revision(engine) == head_revision()
        assert await tables(url) == {
            "inbox_messages",
            "inbox_attempts",
            "inbox_claims",
            "inbox_receipts",
            "inbox_alert_watermarks",
            "inbox_destinations",
            "inbox_source_pauses",
            "inbox_rate_limits",
            "inbox_breakers",
            "inbox_rejected_deliveries",
            "inbox_consumers",
            "inbox_issues",
            "inbox_issue_notices",
            "inbox_bulk_actions",
        }
        await downgrade(engine, "base")
        assert await current_revision(engine) is None
        assert await tables(url) == set()
        await upgrade(engine)
        assert await current_revision(engine) == head_revision()
    finally:
        await engine.dispose()
        await drop_database(pg_server, name)


async def test_a_downgrade_past_0008_turns_claims_into_expiring_leases(pg_server: str) -> None:
    # The older release counts an attempt in flight on the row itself, as a lease its reaper
    # ends once it expires: a claim must not vanish uncounted.
    name = await create_database(pg_server)
    url = with_database(pg_server, name)
    engine = create_engine(url, Settings(database_url="x"))
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await upgrade(engine)
        ids = [
            await conn.fetchval(
                "INSERT INTO inbox_messages (source, message_id, body, status, attempts) "
                "VALUES ('a', $1, '', $2, $3) RETURNING id",
                *row,
            )
            for row in (("claimed", "retrying", 1), ("stale", "pending", 2), ("idle", "pending", 0))
        ]
        await conn.executemany(
            "INSERT INTO inbox_claims (message_id, attempt, locked_until) "
            "VALUES ($1, $2, '2026-01-01T00:00:00Z')",
            [(ids[0], 2), (ids[1], 2)],
        )
        await downgrade(engine, "0007")
        rows = await conn.fetch(
            "SELECT message_id, status, attempts, locked_until IS NOT NULL AS leased "
            "FROM inbox_messages ORDER BY id"
        )
        assert [tuple(r) for r in rows] == [
            ("claimed", "processing", 2, True),
            ("stale", "pending", 2, False),
            ("idle", "pending", 0, False),
        ]
        assert "inbox_claims" not in await tables(url)
    finally:
        await conn.close()
        await engine.dispose()
        await drop_database(pg_server, name)


async def test_message_ids_are_unique_per_source(db: asyncpg.Connection) -> None:
    insert = "INSERT INTO inbox_messages (source, message_id, body) VALUES ($1, $2, '')"
    await db.execute(insert, "a", "1")
    await db.execute(insert, "b", "1")
    try:
        await db.execute(insert, "a", "1")
    except asyncpg.UniqueViolationError:
        pass
    else:
        raise AssertionError("a second (source, message_id) row was allowed")


async def test_deleting_or_truncating_messages_takes_their_attempts_and_only_theirs(
    db: asyncpg.Connection,
) -> None:
    # No foreign key since 0007: statement triggers do what its ON DELETE CASCADE did, for the
    # attempts and (0008) for the claims.
    ids = [
        await db.fetchval(
            "INSERT INTO inbox_messages (source, message_id, body) VALUES ('a', $1, '') "
            "RETURNING id",
            name,
        )
        for name in ("gone-1", "gone-2", "kept")
    ]
    await db.execute(
        "INSERT INTO inbox_attempts (message_id, attempt, started_at, outcome) "
        "SELECT id, n, now(), 'failed' FROM unnest($1::bigint[]) AS id, generate_series(1, 2) n",
        ids,
    )
    await db.execute(
        "INSERT INTO inbox_claims (message_id, attempt, locked_until) "
        "SELECT id, 3, now() FROM unnest($1::bigint[]) AS id",
        ids,
    )
    await db.execute("DELETE FROM inbox_messages WHERE message_id LIKE 'gone-%'")
    left = await db.fetch("SELECT message_id, attempt FROM inbox_attempts ORDER BY attempt")
    assert [(r["message_id"], r["attempt"]) for r in left] == [(ids[2], 1), (ids[2], 2)]
    assert await db.fetchval("SELECT array_agg(message_id) FROM inbox_claims") == [ids[2]]
    await db.execute("TRUNCATE inbox_messages")
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0
    assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0


async def test_a_migration_waits_for_another_longer_than_a_statement_may_take(
    pg_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Statements of the service's engines are cut at 0.5 s here (30 s as shipped): a wait for
    # the migration lock, like an index build over a large inbox, takes longer than that.
    monkeypatch.setattr(db_module, "command_timeout", lambda db_timeout_seconds: 0.5)
    settings = Settings(database_url="x")  # connecting may still take its 5 s on a busy machine
    name = await create_database(pg_server)
    url = with_database(pg_server, name)
    holder = await asyncpg.connect(asyncpg_dsn(url))
    try:
        bounded = create_engine(url, settings)
        try:
            async with bounded.connect() as conn:
                with pytest.raises(TimeoutError):
                    await conn.execute(text("SELECT pg_sleep(1)"))
        finally:
            await bounded.dispose()

        other = holder.transaction()  # another migrator, holding the lock
        await other.start()
        await holder.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        migrating = asyncio.create_task(migrate(url, settings))
        await wait_until(holder, LOCK_WAITERS, 1)
        await asyncio.sleep(1.0)  # twice what one statement may take
        assert not migrating.done()
        await other.commit()
        await asyncio.wait_for(migrating, 60)
        assert await holder.fetchval("SELECT version_num FROM alembic_version") == head_revision()
    finally:
        await holder.close()
        await drop_database(pg_server, name)


async def test_a_migration_waiting_for_a_busy_table_lets_ingest_through_then_completes(
    pg_server: str,
) -> None:
    # A transaction of the running release uses inbox_messages (a batch of handlers holds its
    # rows) while 0008 must lock the table to add its triggers. Waiting for it, the migration
    # would hold up every delivery queued behind it; it gives up its place instead, and tries
    # again until the table is free.
    settings = Settings(database_url="x")
    name = await create_database(pg_server)
    url = with_database(pg_server, name)
    engine = create_engine(url, settings)
    batch = await asyncpg.connect(asyncpg_dsn(url))
    ingest = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await upgrade(engine, "0007")
        transaction = batch.transaction()
        await transaction.start()
        await batch.execute("LOCK TABLE inbox_messages IN ROW EXCLUSIVE MODE")
        migrating = asyncio.create_task(migrate(url, settings))
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE relation = 'inbox_messages'::regclass "
            "AND NOT granted"
        )
        await wait_until(batch, waiting, 1)
        # A delivery arriving now is stored within the migration's bounded wait.
        await asyncio.wait_for(
            ingest.execute(
                "INSERT INTO inbox_messages (source, message_id, body) VALUES ('a', 'm1', '')"
            ),
            10,
        )
        assert not migrating.done()
        await transaction.commit()
        await asyncio.wait_for(migrating, 60)
        assert await current_revision(engine) == head_revision()
        assert await ingest.fetchval("SELECT count(*) FROM inbox_messages") == 1
    finally:
        await batch.close()
        await ingest.close()
        await engine.dispose()
        await drop_database(pg_server, name)
