"""bench/search: searching a large inbox by payload, headers and message id prefix (issue 67).

The fill half: a persistent database (`search_bench`, kept between runs) grown to `--rows`
messages of three providers' shapes (bench/search_rows.py), in batches of 250,000 rows, each
its own transaction and recorded in the table `bench_fill`, so that a fill stopped part way
resumes where it stopped and a later, larger `--rows` inserts only the rest. The search
indexes are dropped for the fill (their definitions kept in `bench_fill`, so that they come
back even where no migration on this branch creates them) and built again after it, then the
tables are vacuumed and analysed. A fill writes at the schema before the search's, so that the
measure's first step is migration 0025 on the filled inbox.

The measure half (bench/search_measure.py): migration 0025, timed; each search form's first
page through the service's listing, alone, with `status=dead` and within the last day, its
p50 and p99 and its plan (EXPLAIN ANALYZE, BUFFERS); a dry run's count; the console's counts; a
replay by search of 10,000 messages, put back after. `--part ingest` (bench/search_ingest.py)
is the insert path with the search indexes against without, on fresh databases of its own.
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

from bench import search_ingest
from bench.pg import connected, migrate, with_database
from bench.search_measure import measure_counts, measure_dry_runs, measure_replay, measure_searches
from bench.search_rows import INSERT, fingerprints
from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import head_revision
from service.core.settings import Settings

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
# Indexes a search's plan may use besides them, named in the printed table.
OTHER_INDEXES = (
    "inbox_messages_received_idx",
    "inbox_messages_status_received_idx",
    "inbox_messages_source_received_idx",
    "inbox_messages_pkey",
)
INDEX_MEMORY = "1GB"
# The schema a fill writes at: the one before the search's (0025), so that the measure's first
# step is migration 0025 itself on the filled inbox, timed (`migrate_to_search`).
FILL_REVISION = "0024"

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
    parser.add_argument("--fill-only", action="store_true", help="fill the inbox and stop")
    parser.add_argument(
        "--measure-only", action="store_true", help="measure the inbox as it is, without a fill"
    )
    parser.add_argument(
        "--part",
        choices=("all", "searches", "ingest"),
        default="all",
        help="searches: the fill and the inbox's figures; ingest: the insert path with the "
        "search indexes against without, on fresh databases; all: both (all)",
    )
    parser.add_argument("--calls", type=int, default=50, help="timed calls a search (50)")
    parser.add_argument("--ingest-rounds", type=int, default=5, help="ingest rounds (5)")
    parser.add_argument(
        "--ingest-seconds", type=int, default=10, help="seconds an ingest cell (10)"
    )
    parser.add_argument(
        "--search-payload",
        action="store_true",
        help="ingest: the source opts its payloads into the search index (search_payload = true)",
    )
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (32)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (2)")
    parser.add_argument(
        "--max-rps", type=int, default=24000, help="requests written a second of a cell (24000)"
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
    async with connected(url) as conn:
        revision = await schema_revision(conn)
    if revision is None or revision < FILL_REVISION:
        await migrate(url, FILL_REVISION)
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


async def schema_revision(conn: Any) -> str | None:
    """The database's migration revision, None before the first."""
    if not await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL"):
        return None
    revision: str | None = await conn.fetchval("SELECT version_num FROM alembic_version")
    return revision


async def migrate_to_search(url: str) -> dict[str, Any]:
    """The service's migrations to head, timed: on an inbox filled at FILL_REVISION, migration
    0025 building its function and three indexes over every row while inserts wait, as an
    operator's `webhook-inbox migrate` would (the server's own `maintenance_work_mem`). A
    database already at head reports the last migration recorded in `bench_fill`."""
    async with connected(url) as conn:
        # The bench's sources have `search_payload`, as if from the start: the column comes
        # before 0025 (which then keeps it), defaulting to true, so that the filled rows are
        # searchable without rewriting them. Also for a database migrated before the column was.
        await conn.execute(
            "ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS searchable boolean NOT NULL "
            "DEFAULT true"
        )
        before = await schema_revision(conn)
        filled = await conn.fetchval(FILLED)
        if before == head_revision():
            row = await conn.fetchrow(
                "SELECT rows, seconds FROM bench_fill WHERE step = 'migrate' "
                "ORDER BY at DESC LIMIT 1"
            )
            say(f"already at {before}: migrated before")
            return {
                "from": before,
                "ran": False,
                "rows": row["rows"] if row else None,
                "seconds": round(row["seconds"], 1) if row else None,
            }
        memory = await conn.fetchval("SHOW maintenance_work_mem")
    say(f"migrating {filled:,} rows from {before} to {head_revision()} ...")
    started = time.monotonic()
    await migrate(url)
    seconds = time.monotonic() - started
    async with connected(url) as conn:
        await conn.execute(RECORD, "migrate", filled, seconds, None, None)
        await conn.execute("ANALYZE inbox_messages")
        sizes = {
            name: round(await conn.fetchval("SELECT pg_relation_size($1::regclass)", name) / 2**20)
            for name in SEARCH_INDEXES
        }
    say(f"migrated in {seconds:.0f} s; index sizes (MB): {sizes}")
    return {
        "from": before,
        "ran": True,
        "rows": filled,
        "seconds": round(seconds, 1),
        "maintenance_work_mem": memory,
        "index_mb": sizes,
    }


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


async def measure(url: str, calls: int) -> dict[str, Any]:
    """The inbox's figures (bench/search_measure.py), after migration 0025, timed."""
    result: dict[str, Any] = {"migration": await migrate_to_search(url)}
    async with connected(url) as conn:
        result["rows"] = await conn.fetchval("SELECT count(*) FROM inbox_messages")
        newest = await conn.fetchval("SELECT max(received_at) FROM inbox_messages")
        result["settings"] = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("server_version", "shared_buffers", "work_mem", "jit")
        }
    engine = create_engine(url, Settings(database_url=url))
    try:
        say(f"searches on {result['rows']:,} messages, newest {newest:%Y-%m-%d %H:%M}:")
        result["searches"] = await measure_searches(engine, url, result["rows"], newest, calls, say)
        result["dry_run_count"] = await measure_dry_runs(engine, calls)
        say(f"  dry run's count, a customer: {result['dry_run_count']}")
        result["counts"] = await measure_counts(engine, calls)
        say(f"  console's counts: {result['counts']}")
        result["replay"] = await measure_replay(engine, url, newest, say)
        say(f"  replay: {result['replay']}")
    finally:
        await engine.dispose()
    return result


def report_measure(result: dict[str, Any]) -> None:
    say(f"\n{result['rows']:,} messages; migration 0025: {result['migration']['seconds']} s")
    say(f"{'search':<32} {'variant':<12} {'p50 ms':>8} {'p99 ms':>8} {'matches':>9}  index")
    for name, figures in result["searches"].items():
        form, variant = name.split(" / ")
        plan = " ".join(figures.get("explain", {}).get("custom", []))
        used = sorted({i for i in SEARCH_INDEXES + OTHER_INDEXES if i in plan}) or ["-"]
        matches = figures["matches_sample"]
        say(
            f"{form:<32} {variant:<12} {figures['p50_ms']:>8.1f} {figures['p99_ms']:>8.1f} "
            f"{matches if matches is not None else 'too broad':>9}  "
            + ", ".join(u.removeprefix("inbox_messages_") for u in used)
        )
    dry, counts, replay = result["dry_run_count"], result["counts"], result["replay"]
    say(f"dry run's count (a customer): p50 {dry['p50_ms']} ms, p99 {dry['p99_ms']} ms")
    say(
        f"console's stats: p50 {counts['stats']['p50_ms']} ms, p99 {counts['stats']['p99_ms']} "
        f"ms (first read {counts['first_read_ms']} ms); counts by status p50 "
        f"{counts['status_counts']['p50_ms']} ms, p99 {counts['status_counts']['p99_ms']} ms"
    )
    say(
        f"replay by search: {replay['retried']:,} messages in {replay['seconds']} s "
        f"({replay['messages_per_second']:,}/s)"
    )


def report_ingest(result: dict[str, Any]) -> None:
    say(
        f"ingest, search indexes against none ({len(result['rounds'])} rounds of "
        f"{result['seconds_a_cell']} s, {result['body_bytes']}-byte bodies): req/s ratio "
        f"{result['rps_ratio']}, p99 ratio {result['p99_ratio']}; req/s {result['rps']}; "
        f"p99 ms {result['p99_ms']}; every acknowledged delivery stored: {result['all_stored']}"
    )


def main() -> None:
    args = parse_args()
    url = asyncpg_dsn(args.database_url)
    if args.drop:
        asyncio.run(drop_database(url))
        say(f"dropped database {database_name(url)}")
        return
    if args.rows < 1 or args.batch < 1:
        sys.exit("--rows and --batch: at least 1")
    document: dict[str, Any] = {"database": database_name(url), "loadavg_start": os.getloadavg()}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(exist_ok=True)
    if args.part in ("all", "searches") and not args.measure_only:
        document["fill"] = asyncio.run(fill(url, args.rows, args.batch))
        report(url, document["fill"])
        if args.fill_only:
            path = RESULTS / f"search-fill-{stamp}.json"
            path.write_text(json.dumps(document, indent=2))
            say(f"results: {path}")
            return
    if args.part in ("all", "searches"):
        document |= asyncio.run(measure(url, args.calls))
    if args.part in ("all", "ingest"):
        say("ingest with the search indexes against without:")
        document["ingest"] = search_ingest.run(args, say)
    if "searches" in document:
        report_measure(document)
    if "ingest" in document:
        report_ingest(document["ingest"])
    document["loadavg_end"] = os.getloadavg()
    size = f"{document['rows'] / 1e6:g}m" if "rows" in document else "ingest"
    path = RESULTS / f"search-{size}-{stamp}.json"
    path.write_text(json.dumps(document, indent=2, default=str))
    say(f"results: {path}")


if __name__ == "__main__":
    main()
