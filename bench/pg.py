"""PostgreSQL for benchmarks: DATABASE_URL when set, else an embedded server in a temp dir."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from service.core.db import create_engine
from service.core.migrations import upgrade
from service.core.settings import Settings

# Settings worth printing next to results: they decide what a COMMIT costs.
REPORTED_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "shared_buffers",
    "max_connections",
)

# About one checkpoint's worth of WAL at the default max_wal_size (1 GB).
WAL_TO_RECYCLE_MB = 900


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to `url` for one step of a run, closed after it."""
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


def with_database(url: str, name: str) -> str:
    """`url` pointing at database `name` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


class BenchPostgres:
    """A server the bench may create (and drop) its own databases on."""

    def __init__(self) -> None:
        self._server: Any = None
        self._root: Path | None = None
        self.url = ""
        self.embedded = False

    def __enter__(self) -> BenchPostgres:
        if url := os.environ.get("DATABASE_URL"):
            self.url = url
            return self
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from service.core.db import get_embedded_server

            self._root = Path(tempfile.mkdtemp(prefix="inbox-bench-pg-"))
            self._server = get_embedded_server(self._root / "pgdata", cleanup_mode="delete")
        self.url = self._server.get_uri()
        self.embedded = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.cleanup()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def cpu_seconds(self) -> float | None:
        """User+system CPU of the embedded server's processes so far (None: not embedded).

        Backends that already exited count too: the postmaster reaps them, and the kernel adds
        their CPU to its children's. (One reaped between the two reads here is missed.)
        """
        if self._root is None:
            return None
        import psutil

        pid = int((self._root / "pgdata" / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        own = postmaster.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        for proc in postmaster.children():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    async def create_database(self, prefix: str) -> str:
        """A new empty database; returns its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        async with connected(self.url) as conn:
            await conn.execute(f"CREATE DATABASE {name}")
        return with_database(self.url, name)

    async def drop_database(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        async with connected(self.url) as conn:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    async def recycle_wal(self, megabytes: int = WAL_TO_RECYCLE_MB) -> int:
        """Write about `megabytes` of WAL and checkpoint, so that the WAL segments the
        benchmark writes into are recycled ones, as on a server that has been running, rather
        than files created as it goes; returns how many segments the server then holds.

        A fresh server creates each WAL segment (16 MB by default, EMBEDDED_WAL_SEGMENT_MB on
        the embedded one) when it needs it, zero-filled and fsynced, until its first
        checkpoint lets it recycle them. On this machine's ext4 disk, those
        creations stalled commits for 60-90 ms once a run had written a few hundred MB, and
        took p99 past 25 ms (docs/benchmarks.md, "A fresh server's WAL"). Embedded servers
        only: this writes to the server and checkpoints it.
        """
        if not self.embedded:
            raise SystemExit("--recycled-wal needs the embedded server: unset DATABASE_URL")
        async with connected(self.url) as conn:
            # One row writes about 1 KB of WAL; the table is dropped again at once.
            rows = megabytes * 1000
            await conn.execute(
                "CREATE TABLE bench_wal_fill AS"
                f" SELECT g, repeat('x', 900) AS pad FROM generate_series(1, {rows}) g"
            )
            await conn.execute("DROP TABLE bench_wal_fill")
            await conn.execute("CHECKPOINT")
            segments: int = await conn.fetchval("SELECT count(*) FROM pg_ls_waldir()")
            return segments

    async def settings(self) -> dict[str, str]:
        async with connected(self.url) as conn:
            return {name: await conn.fetchval(f"SHOW {name}") for name in REPORTED_SETTINGS}


async def migrate(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to the inbox's schema (or to `revision` of it), as
    `webhook-inbox migrate` does: no bound on a statement, as an index build on a large inbox
    takes minutes."""
    engine = create_engine(url, Settings(database_url=url), bounded_statements=False)
    await upgrade(engine, revision)
    await engine.dispose()


def add_recycled_wal_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """`--recycled-wal`, for a benchmark whose `what` (its cells, its runs) write to the
    embedded server: `recycled_wal` then prepares the server."""
    parser.add_argument(
        "--recycled-wal",
        action="store_true",
        help="first have the embedded PostgreSQL write and checkpoint about 900 MB of WAL, "
        f"so that the {what} write into recycled WAL segments, as on a server that has been "
        "running, instead of segments created as they go (not the default: the fresh "
        "server's tail is reported unless asked)",
    )


def recycled_wal(pg: BenchPostgres) -> int:
    """`BenchPostgres.recycle_wal`, said on the console; how many segments the server holds."""
    segments = asyncio.run(pg.recycle_wal())
    print(f"recycled WAL: the server holds {segments} segments", flush=True)
    return segments
