"""Alembic environment: runs over the connection handed to it, or over DATABASE_URL."""

from __future__ import annotations

import asyncio

from sqlalchemy import Connection, text

from alembic import context
from service.core.db import create_engine, database_url
from service.core.migrations import MIGRATION_LOCK, refuse_unknown_revisions
from service.core.schema import metadata
from service.core.settings import Settings

config = context.config
# The tables as the code declares them: `alembic revision --autogenerate` diffs against these,
# and tests/test_schema.py checks that the migrations build exactly them.
target_metadata = metadata


def run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        # One migrator at a time: replicas started together on one database would otherwise
        # run the same migration at once, and all but one fail on what the first created.
        # The lock is the transaction's; whoever waited for it then finds the schema at head.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        # Under `webhook-inbox migrate` and `serve` (service.serve.migrate), the waits for the
        # tables' locks are bounded, and a try cut short is made again: see TABLE_LOCK_WAIT.
        wait = config.attributes.get("table_lock_wait")
        if wait is not None:
            bound = text("SELECT set_config('lock_timeout', :wait, true)")
            connection.execute(bound, {"wait": wait})
        refuse_unknown_revisions(context.get_context(), context.script)
        context.run_migrations()


async def run_standalone() -> None:
    settings = Settings()
    engine = create_engine(database_url(settings), settings, bounded_statements=False)
    async with engine.begin() as conn:
        await conn.run_sync(run_migrations)
    await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
elif context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `webhook-inbox migrate`")
else:
    asyncio.run(run_standalone())
