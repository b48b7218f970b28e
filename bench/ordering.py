"""bench/ordering: one processing process draining a backlog with ordering keys against the
same backlog without, in the same run (issue 52): messages per second, one-row effects.

Each round drains `--messages` messages three times, in rotating order: unordered (no
`ordering_key`), with 1,000 distinct keys (each key's messages spread over the backlog, as
interleaved deliveries store them), and with one key (strict FIFO: one message at a time).
The target is the 1,000-key drain at least 0.8x the unordered one (ratio of medians over
rounds); the one-key rate is reported. Every drain must leave each message processed with one
effect, and each key's effects in acceptance order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.fanout import environment, timed_drain
from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres
from bench.process import HANDLERS
from bench.systems import RESULTS_DIR, console_script

TARGET = 0.8
SHAPES = {"unordered": 0, "1000 keys": 1000, "1 key": 1}

TOML = """
[sources.bench]
kind = "generic"
id_header = "X-Message-Id"
{ordering}handlers = ["bench.handlers:{handler}"]
"""

# As bench/process's backlog, with message g's key g % keys (none when unordered).
INSERT = """
INSERT INTO inbox_messages (source, message_id, event_type, headers, body, content_type,
                            ordering_key)
SELECT 'bench', 'ord-' || g, 'invoice.paid', '{"content-type": "application/json"}'::jsonb,
       convert_to(replace($1, '{id}', 'ord-' || g), 'UTF8'), 'application/json',
       CASE WHEN $3 > 0 THEN 'k' || (g % $3) END
  FROM generate_series(1, $2) AS g
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/ordering",
        description="Drain with ordering keys (1,000 and 1) against the same without.",
    )
    parser.add_argument("--messages", type=int, default=20_000, help="backlog size (20000)")
    parser.add_argument(
        "--fifo-messages",
        type=int,
        default=2_000,
        help="backlog of the one-key drain, which runs one message at a time (2000)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument(
        "--handler",
        default="execute",
        choices=[h for h in HANDLERS if h != "noop"],
        help="the one-row effect's style, as bench/process --handlers (execute)",
    )
    parser.add_argument("--log-level", default="INFO", help="the service's INBOX_LOG_LEVEL")
    return parser.parse_args(argv)


async def insert(url: str, messages: int, keys: int) -> float:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(INSERT, BODY_TEMPLATE, messages, keys)
            await conn.execute("NOTIFY webhook_inbox")
        return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))
    finally:
        await conn.close()


async def verify(url: str, messages: int) -> bool:
    """Every message processed with one effect, and each key's effects in id order."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            """
            SELECT (SELECT count(*) FROM inbox_messages WHERE status = 'processed') AS processed,
                   (SELECT count(*) FROM bench_effects) AS effects,
                   (SELECT count(DISTINCT inbox_id) FROM bench_effects) AS distinct_effects,
                   (SELECT count(*) FROM (
                        SELECT e.inbox_id < lag(e.inbox_id) OVER (
                                   PARTITION BY m.ordering_key ORDER BY e.id) AS backwards
                          FROM bench_effects e JOIN inbox_messages m ON m.id = e.inbox_id
                         WHERE m.ordering_key IS NOT NULL) AS t WHERE backwards) AS out_of_order
            """
        )
        return bool(
            row["processed"] == messages
            and row["effects"] == messages
            and row["distinct_effects"] == messages
            and row["out_of_order"] == 0
        )
    finally:
        await conn.close()


def drain(url: str, env: dict[str, str], work: Path, messages: int, keys: int) -> dict[str, Any]:
    seconds = timed_drain(
        url, env, work / f"worker-{keys}.log", lambda: insert(url, messages, keys)
    )
    return {
        "keys": keys,
        "messages": messages,
        "seconds": seconds,
        "rate": messages / seconds,
        "exactly_once_in_order": asyncio.run(verify(url, messages)),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    handler = HANDLERS[args.handler]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {shape: [] for shape in SHAPES}
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-ordering-") as tmp:
        work = Path(tmp)
        url = asyncio.run(pg.create_database("bench_ordering"))
        envs = {
            shape: environment(
                url,
                work,
                shape.replace(" ", "-"),
                TOML.format(ordering='ordering_key = "/key"\n' if keys else "", handler=handler),
                args.log_level,
            )
            for shape, keys in SHAPES.items()
        }
        subprocess.run(
            [*console_script("webhook-inbox"), "migrate"],
            env=envs["unordered"],
            check=True,
            capture_output=True,
        )
        shapes = list(SHAPES)
        for round_ in range(args.rounds):
            shift = round_ % len(shapes)
            for shape in shapes[shift:] + shapes[:shift]:
                keys = SHAPES[shape]
                messages = args.fifo_messages if keys == 1 else args.messages
                run = drain(url, envs[shape], work, messages, keys)
                runs[shape].append(run)
                print(
                    f"round {round_ + 1}: {shape:9} {run['rate']:7.0f} msgs/s "
                    f"({messages} messages) in order, once: {run['exactly_once_in_order']}",
                    flush=True,
                )
        asyncio.run(pg.drop_database(url))
    medians = {shape: statistics.median(r["rate"] for r in rs) for shape, rs in runs.items()}
    by_round = [
        k["rate"] / u["rate"] for k, u in zip(runs["1000 keys"], runs["unordered"], strict=True)
    ]
    ratio = medians["1000 keys"] / medians["unordered"]
    print()
    for shape, rate in medians.items():
        print(f"{shape:9}: {rate:.0f} msgs/s (median)")
    print(
        f"1000 keys / unordered: {ratio:.2f} (by round {', '.join(f'{r:.2f}' for r in by_round)}); "
        f"target >= {TARGET}: {'met' if ratio >= TARGET else 'MISSED'}"
    )
    print(f"load average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"ordering-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"runs": runs, "ratio": ratio}, indent=2))
    print(f"results: {out}")
    if not all(r["exactly_once_in_order"] for rs in runs.values() for r in rs):
        sys.exit(2)


if __name__ == "__main__":
    main()
