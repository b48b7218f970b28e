"""Alembic environment: runs over the connection handed to it, or over DATABASE_URL."""

from __future__ import annotations

import asyncio

from sqlalchemy import Connection

from alembic import context
from service.core.db import create_engine, database_url
from service.core.schema import metadata
from service.core.settings import Settings

config = context.config
# The tables as the code declares them: `alembic revision --autogenerate` diffs against these,
# and tests/test_schema.py checks that the migrations build exactly them.
target_metadata = metadata


def run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def run_standalone() -> None:
    settings = Settings()
    engine = create_engine(database_url(settings), settings)
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
