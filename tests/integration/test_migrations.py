"""Alembic migrations upgrade and downgrade cleanly on a real database."""

from __future__ import annotations

import asyncpg

from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import current_revision, downgrade, head_revision, upgrade
from service.core.settings import Settings
from tests.pg import create_database, drop_database, with_database


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
        assert await tables(url) == {"inbox_messages", "inbox_attempts", "inbox_alert_watermarks"}
        await downgrade(engine, "base")
        assert await current_revision(engine) is None
        assert await tables(url) == set()
        await upgrade(engine)
        assert await current_revision(engine) == head_revision()
    finally:
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
