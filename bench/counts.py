"""bench/counts: what one read of the counts by status costs on a large inbox.

`/metrics`, `GET /admin/stats` and the console's overview each read them every few seconds.
The baseline, in the same run, is the read that counts every row (as the `stats` command
does); against it, the service's read through `EndedCounts` (service/store/counts.py),
one read a second for `--duration` seconds, as a scrape or an open console makes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from bench.pg import BenchPostgres, connected, migrate
from service.core.db import asyncpg_dsn, create_engine
from service.core.settings import Settings
from service.store.counts import ENDED_COUNTS, EndedCounts, status_counts

RESULTS = Path(__file__).resolve().parent / "results"

# 0.7% pending and 0.1% dead, the rest processed, over three sources.
FILL = """
INSERT INTO inbox_messages (source, message_id, event_type, status, received_at, body, headers)
SELECT (ARRAY['stripe', 'github', 'shopify'])[1 + g % 3], 'm' || g, 'invoice.paid',
       CASE WHEN g % 1000 < 7 THEN 'pending' WHEN g % 1000 = 7 THEN 'dead' ELSE 'processed' END,
       now() - g * interval '1 millisecond', '\\x7b7d',
       '{"content-type": "application/json", "user-agent": "Stripe/1.0"}'
  FROM generate_series($1::bigint, $2::bigint) g
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/counts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="inbox rows (1,000,000)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of reads (30)")
    parser.add_argument("--baseline-reads", type=int, default=5, help="full reads (5)")
    return parser.parse_args()


async def fill(url: str, rows: int) -> None:
    async with connected(asyncpg_dsn(url)) as conn:
        step = 500_000
        for first in range(1, rows + 1, step):
            await conn.execute(FILL, first, min(first + step - 1, rows))
        await conn.execute("VACUUM ANALYZE inbox_messages")


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = create_engine(url, Settings(database_url=url))
    counted = [0]

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def on_execute(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement == ENDED_COUNTS.text:
            counted[0] += 1

    try:
        full = []
        for _ in range(args.baseline_reads):
            started = time.perf_counter()
            await status_counts(engine)
            full.append(time.perf_counter() - started)
        processed = EndedCounts(engine)
        counted[0] = 0
        reads = []
        end = time.monotonic() + args.duration
        while time.monotonic() < end:
            started = time.perf_counter()
            await status_counts(engine, processed)
            reads.append(time.perf_counter() - started)
            await asyncio.sleep(1.0)
        await processed.close()
    finally:
        await engine.dispose()
    return {
        "rows": args.rows,
        "full_read_ms": [round(t * 1000, 1) for t in full],
        "full_read_median_ms": round(statistics.median(full) * 1000, 1),
        "reads": len(reads),
        "first_read_ms": round(reads[0] * 1000, 1),
        "read_median_ms": round(statistics.median(reads) * 1000, 1),
        "read_max_after_first_ms": round(max(reads[1:], default=0) * 1000, 1),
        "processed_counts_run": counted[0],
    }


async def main(args: argparse.Namespace) -> None:
    with BenchPostgres() as pg:
        url = await pg.create_database("bench_counts")
        try:
            await migrate(url)
            started = time.monotonic()
            await fill(url, args.rows)
            print(f"filled {args.rows:,} rows in {time.monotonic() - started:.0f} s", flush=True)
            result = await measure(url, args)
        finally:
            await pg.drop_database(url)
    ratio = result["full_read_median_ms"] / max(result["read_median_ms"], 0.001)
    result["full_over_read_median"] = round(ratio, 1)
    print(
        f"full read (every row counted), {args.baseline_reads} reads: median "
        f"{result['full_read_median_ms']} ms {result['full_read_ms']}\n"
        f"service read, one a second for {args.duration:.0f} s: {result['reads']} reads, first "
        f"{result['first_read_ms']} ms, median {result['read_median_ms']} ms, slowest after "
        f"the first {result['read_max_after_first_ms']} ms; processed rows counted "
        f"{result['processed_counts_run']} times\n"
        f"full / service median: {ratio:.1f}x"
    )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"counts-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
