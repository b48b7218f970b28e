"""bench/search: searching a large inbox by payload, headers and message id prefix (issue 67).

The fill half: a persistent database (`search_bench`, kept between runs) grown to `--rows`
messages of three providers' shapes (bench/search_rows.py), in batches of 250,000 rows, each
its own transaction and recorded in the table `bench_fill`, so that a fill stopped part way
resumes where it stopped and a later, larger `--rows` inserts only the rest. The search
indexes are dropped for the fill (their definitions kept in `bench_fill`, so that they come
back even where no migration on this branch creates them) and built again after it, then the
tables are vacuumed and analysed. The measure half is to come; `--fill-only` stops after the
fill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.pg import connected, migrate, with_database
from bench.search_rows import INSERT, fingerprints
from service.core.db import asyncpg_dsn
from service.core.migrations import SchemaAhead

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/search_bench"
BATCH = 250_000
# The indexes the searches need (migration 0025 on main): built once after a fill, not
# updated row by row during it.
SEARCH_INDEXES = (
    "inbox_messages_payload_idx",
    "inbox_messages_headers_idx",
    "inbox_messages_message_id_prefix_idx",
)
INDEX_MEMORY = "1GB"

# What each fill did. `rows` is the number of the series' last row written by then (the rows
# the fill put in the inbox); a 'drop index' step keeps the index's definition. The first
# row's `at` is the anchor of the received times (bench/search_rows.py).
MARKER = """
CREATE TABLE IF NOT EXISTS bench_fill (
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    step text NOT NULL,
    rows bigint NOT NULL,
    seconds double precision NOT NULL DEFAULT 0,
    index_name text,
    indexdef text
)
"""
FILLED = "SELECT coalesce(max(rows) FILTER (WHERE step = 'insert'), 0) FROM bench_fill"
RECORD = (
    "INSERT INTO bench_fill (step, rows, seconds, index_name, indexdef) VALUES ($1, $2, $3, $4, $5)"
)
PRESENT = """
SELECT indexname, indexdef FROM pg_indexes
 WHERE schemaname = current_schema() AND tablename = 'inbox_messages'
   AND indexname = ANY($1::text[])
"""
# The last definition kept of each search index this database has had.
KEPT = """
SELECT DISTINCT ON (index_name) index_name, indexdef FROM bench_fill
 WHERE step = 'drop index' AND index_name = ANY($1::text[])
 ORDER BY index_name, at DESC
"""
SIZES = """
SELECT pg_total_relation_size('inbox_messages') AS messages,
       pg_total_relation_size('inbox_attempts') AS attempts,
       pg_database_size(current_database()) AS database
"""


def default_url() -> str:
    """`search_bench` on DATABASE_URL's server when it is set, else on the local PostgreSQL."""
    if url := os.environ.get("DATABASE_URL"):
        return with_database(asyncpg_dsn(url), "search_bench")
    return DEFAULT_URL


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/search", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=default_url(),
        help="the bench's database, created when missing and kept "
        "(default: search_bench on DATABASE_URL's server, else %(default)s)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=1_000_000,
        help="messages the inbox is to hold; only the ones missing are inserted (1,000,000)",
    )
    parser.add_argument("--batch", type=int, default=BATCH, help="rows a transaction (%(default)s)")
    parser.add_argument(
        "--fill-only", action="store_true", help="fill the inbox and stop (the measure is to come)"
    )
    parser.add_argument("--drop", action="store_true", help="drop the bench's database and stop")
    return parser.parse_args()


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def create_database(url: str) -> bool:
    """Create the database `url` names unless it exists; whether it was created."""
    name = database_name(url)
    async with connected(with_database(url, "postgres")) as conn:
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return False
        await conn.execute(f"CREATE DATABASE {quoted(name)}")
        return True


async def drop_database(url: str) -> None:
    async with connected(with_database(url, "postgres")) as conn:
        await conn.execute(f"DROP DATABASE IF EXISTS {quoted(database_name(url))} WITH (FORCE)")


def say(line: str) -> None:
    print(line, flush=True)


async def fill(url: str, rows: int, batch: int = BATCH) -> dict[str, Any]:
    """Grow the inbox at `url` to `rows` messages; what it took and what it holds after."""
    if await create_database(url):
        say(f"created database {database_name(url)}")
    try:
        await migrate(url)
    except SchemaAhead as exc:
        # A newer branch (main's 0025) migrated it; the columns the fill writes are the same.
        say(f"not migrated: {exc}")
    started = time.monotonic()
    async with connected(asyncpg_dsn(url)) as conn:
        await conn.execute(MARKER)
        before = await conn.fetchval(FILLED)
        await conn.execute(RECORD, "start", before, 0.0, None, None)
        anchor = await conn.fetchval("SELECT min(at) FROM bench_fill")
        result: dict[str, Any] = {"rows_before": before, "rows": max(before, rows)}
        if before < rows:
            await drop_search_indexes(conn, before)
            result["insert_seconds"] = await insert(conn, before, rows, anchor, batch)
        else:
            say(f"the inbox already holds {before:,} filled rows: nothing to insert")
        result["index_seconds"] = await create_search_indexes(conn, max(before, rows))
        if before < rows or result["index_seconds"]:
            vacuum_started = time.monotonic()
            await conn.execute("VACUUM ANALYZE inbox_messages, inbox_attempts")
            result["vacuum_seconds"] = round(time.monotonic() - vacuum_started, 1)
            say(f"VACUUM ANALYZE: {result['vacuum_seconds']:.0f} s")
        result["seconds"] = round(time.monotonic() - started, 1)
        await conn.execute(RECORD, "done", result["rows"], result["seconds"], None, None)
        sizes = await conn.fetchrow(SIZES)
    result["sizes_mb"] = {name: round(size / 2**20) for name, size in sizes.items()}
    inserted = result["rows"] - before
    result["rows_per_second"] = round(inserted / result["insert_seconds"]) if inserted else None
    return result


async def drop_search_indexes(conn: Any, filled: int) -> None:
    """Drop the search indexes there are, each definition kept in `bench_fill` first."""
    for name, definition in await conn.fetch(PRESENT, list(SEARCH_INDEXES)):
        async with conn.transaction():
            await conn.execute(RECORD, "drop index", filled, 0.0, name, definition)
            await conn.execute(f"DROP INDEX {quoted(name)}")
        say(f"dropped {name} for the fill: {definition}")


async def insert(conn: Any, filled: int, rows: int, anchor: Any, batch: int) -> float:
    """Insert rows `filled + 1`..`rows`, a batch a transaction; the seconds it took."""
    causes = json.dumps(fingerprints())
    started = time.monotonic()
    done = filled
    while done < rows:
        last = min(done + batch, rows)
        batch_started = time.monotonic()
        async with conn.transaction():
            await conn.execute(INSERT, done + 1, last, anchor, causes)
            seconds = time.monotonic() - batch_started
            await conn.execute(RECORD, "insert", last, seconds, None, None)
        elapsed = time.monotonic() - started
        rate = (last - filled) / elapsed
        say(
            f"{last:>12,} / {rows:,} rows  {(last - done) / seconds:>8,.0f} rows/s this batch  "
            f"{rate:>8,.0f} rows/s  {elapsed:>6.0f} s elapsed  ETA {(rows - last) / rate:.0f} s"
        )
        done = last
    return round(time.monotonic() - started, 1)


async def create_search_indexes(conn: Any, filled: int) -> dict[str, float]:
    """Build again each search index that was dropped and is still missing; seconds each."""
    present = {row["indexname"] for row in await conn.fetch(PRESENT, list(SEARCH_INDEXES))}
    await conn.execute(f"SET maintenance_work_mem = '{INDEX_MEMORY}'")
    took = {}
    for name, definition in await conn.fetch(KEPT, list(SEARCH_INDEXES)):
        if name in present:
            continue
        started = time.monotonic()
        await conn.execute(definition)
        took[name] = round(time.monotonic() - started, 1)
        await conn.execute(RECORD, "create index", filled, took[name], name, definition)
        say(f"built {name}: {took[name]:.0f} s")
    await conn.execute("RESET maintenance_work_mem")
    return took


def report(url: str, result: dict[str, Any]) -> None:
    sizes = result["sizes_mb"]
    rate = result["rows_per_second"]
    lines = [
        ("database", database_name(url)),
        ("rows before", f"{result['rows_before']:,}"),
        ("rows after", f"{result['rows']:,}"),
        ("insert", f"{result.get('insert_seconds', 0):,.0f} s"),
        ("rows/s", f"{rate:,}" if rate else "-"),
        *((f"index {name}", f"{s:,.0f} s") for name, s in result["index_seconds"].items()),
        ("VACUUM ANALYZE", f"{result.get('vacuum_seconds', 0):,.0f} s"),
        ("in all", f"{result['seconds']:,.0f} s"),
        ("inbox_messages", f"{sizes['messages']:,} MB"),
        ("inbox_attempts", f"{sizes['attempts']:,} MB"),
        ("database on disk", f"{sizes['database']:,} MB"),
    ]
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        say(f"{name:<{width}}  {value:>12}")


def main() -> None:
    args = parse_args()
    url = asyncpg_dsn(args.database_url)
    if args.drop:
        asyncio.run(drop_database(url))
        say(f"dropped database {database_name(url)}")
        return
    if args.rows < 1 or args.batch < 1:
        sys.exit("--rows and --batch: at least 1")
    result = asyncio.run(fill(url, args.rows, args.batch))
    report(url, result)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"search-fill-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"database": database_name(url), **result}, indent=2))
    say(f"results: {path}")
    # The measure half (issue 67) is to run here, after the fill, unless --fill-only.


if __name__ == "__main__":
    main()
