"""bench/isolation: one source's figures alone against the same beside a throttled backlog, in
the same run (issue 63): a named destination of source `a` limited to 1/s holding a backlog of
10,000, and source `b` beside it.

Each round runs two cells in alternating order, each on a fresh `serve` (one HTTP and one
processing process): `alone` (no backlog of `a`) and `beside` (`--backlog` messages of `a`,
every one claimed once and queued behind its destination's limit before `b` is measured). In
each cell, `b`'s drain rate (a backlog of `--drain` messages inserted at once, to its last
processed mark) and, under an open-loop `--rate` deliveries/s for `--duration` seconds
(bench/openloop), its accept-to-processed p99 (the effect's commit clock less the message's
`received_at`). The ratios (beside over alone) are of medians over rounds, each round's
shown; the target is within 10 % (drain rate at least 0.9x, p99 at most 1.1x). Each cell also
counts the claims of `a`'s messages a second, the mechanism's own figure and steady whatever
the machine's load. Every cell
must leave each of `b`'s messages processed with one effect, and `a`'s destination must run
no faster than its limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.fanout import environment
from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres, migrate
from bench.process import (
    HANDLERS,
    add_effect_arguments,
    latency_facts,
    openloop,
    prepare,
    wait_for_listeners,
)
from bench.servers import Server
from bench.systems import RESULTS_DIR, console_script

TARGET = 0.1  # within 10 %
RATE_LIMIT = 1.0  # a's destination, a second

TOML = """
[sources.a]
kind = "generic"
id_header = "X-Message-Id"

[sources.a.destinations.slow]
handlers = ["bench.handlers:{handler}"]
rate_limit = "1/s"

[sources.b]
kind = "generic"
id_header = "X-Message-Id"
handlers = ["bench.handlers:{handler}"]
"""

INSERT = """
INSERT INTO inbox_messages (source, message_id, event_type, headers, body, content_type)
SELECT $1, $2 || g, 'invoice.paid', '{"content-type": "application/json"}'::jsonb,
       convert_to(replace($3, '{id}', $2 || g), 'UTF8'), 'application/json'
  FROM generate_series(1, $4) AS g
"""
QUEUED = "SELECT count(*) FROM inbox_destinations WHERE destination = 'slow'"
SLOW_DONE = (
    "SELECT count(*) FROM inbox_destinations WHERE destination = 'slow' AND status = 'processed'"
)
B_LEFT = (
    "SELECT EXISTS (SELECT FROM inbox_messages WHERE source = 'b' "
    "AND status IN ('pending', 'retrying', 'processing'))"
)
CLAIMS = "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'inbox_claims'"
# Each claim of one of a's messages writes its destination's row (a deferral or a run): only a
# has named destinations, so these count a's claims, whatever the machine's speed.
A_CLAIMS = (
    "SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relname = 'inbox_destinations'"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/isolation",
        description="Source b alone against b beside a 1/s destination holding a backlog.",
    )
    parser.add_argument("--backlog", type=int, default=10_000, help="a's backlog (10000)")
    parser.add_argument("--drain", type=int, default=20_000, help="b's drained backlog (20000)")
    parser.add_argument("--rate", type=float, default=1000.0, help="b's offered msgs/s (1000)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds offered (20)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both cells (2)")
    add_effect_arguments(parser, log_level="WARNING")
    return parser.parse_args(argv)


async def fetchval(url: str, query: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def insert(url: str, source: str, prefix: str, messages: int) -> float:
    """`messages` of `source` committed at once, NOTIFY; the database's clock at commit."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(INSERT, source, prefix, BODY_TEMPLATE, messages)
            await conn.execute("NOTIFY webhook_inbox")
        return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))
    finally:
        await conn.close()


async def wait_for(url: str, query: str, done: Any, timeout: float) -> None:
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + timeout
        while (value := await conn.fetchval(query)) != done:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{query!r} is {value!r} after {timeout} s, not {done!r}")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def settled(url: str, query: str, timeout: float = 20.0) -> Any:
    """`query`'s counter once it moves by a few a second at most (a's one run a second): the
    statistics views count what other backends did up to 10 s late, so a counter read at once
    would put what came before (a's backlog being queued) into the window measured after."""
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + timeout
        value = await conn.fetchval(query)
        while time.monotonic() < deadline:
            await asyncio.sleep(2.0)
            now = await conn.fetchval(query)
            if now - value <= 6:
                return now
            value = now
        return value
    finally:
        await conn.close()


async def b_facts(url: str, prefix: str) -> dict[str, Any]:
    """b's messages of `prefix`: processed, effects, and the span from the first accepted to
    the last processed."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            """
            SELECT count(*) FILTER (WHERE m.status = 'processed') AS processed,
                   (SELECT count(*) FROM bench_effects e WHERE e.message_id LIKE $1 || '%')
                       AS effects,
                   extract(epoch FROM max(m.processed_at)) AS last,
                   extract(epoch FROM max(m.processed_at) - min(m.received_at)) AS span
              FROM inbox_messages m
             WHERE m.source = 'b' AND m.message_id LIKE $1 || '%'
            """,
            prefix,
        )
        return dict(row)
    finally:
        await conn.close()


def cell(
    url: str, env: dict[str, str], work: Path, args: argparse.Namespace, beside: bool
) -> dict[str, Any]:
    """One cell on a fresh `serve`: b's drain rate, then its p99 under the open loop."""
    asyncio.run(prepare(url))
    asyncio.run(fetchval(url, "DELETE FROM inbox_rate_limits"))
    command = [*console_script("webhook-inbox"), "serve", "--no-migrate"]
    facts: dict[str, Any] = {"beside": beside}
    with Server("service", command, env, work / "serve.log") as srv:
        asyncio.run(wait_for_listeners(url, 1))
        if beside:
            started = time.monotonic()
            asyncio.run(insert(url, "a", "a-", args.backlog))
            asyncio.run(wait_for(url, QUEUED, args.backlog, timeout=300))
            facts["queued_in_s"] = round(time.monotonic() - started, 1)
        a_before = asyncio.run(settled(url, A_CLAIMS))
        slow_before = asyncio.run(fetchval(url, SLOW_DONE))
        claims_before, at = asyncio.run(fetchval(url, CLAIMS)), time.monotonic()
        load_before = os.getloadavg()[0]
        committed = asyncio.run(insert(url, "b", "drain-", args.drain))
        asyncio.run(wait_for(url, B_LEFT, False, timeout=300))
        drained = asyncio.run(b_facts(url, "drain-"))
        facts["drain_per_s"] = args.drain / (float(drained["last"]) - committed)
        load = openloop(f"{srv.url}/webhooks/b", args.rate, args.duration, "lat", work / "a.txt")
        asyncio.run(wait_for(url, B_LEFT, False, timeout=120))
        latency = asyncio.run(latency_facts(url, "lat"))
        offered = asyncio.run(b_facts(url, "lat"))
        seconds = time.monotonic() - at
        facts |= {
            "p99_ms": latency["e99"],
            "p50_ms": latency["e50"],
            "processed_per_s": offered["processed"] / float(offered["span"]),
            "http_p99_ms": load["latency_ms"]["p99"],
            "http_failed": load["non_2xx"] + load["errors"],
            "claims_per_s": (asyncio.run(fetchval(url, CLAIMS)) - claims_before) / seconds,
            "a_claims_per_s": (asyncio.run(fetchval(url, A_CLAIMS)) - a_before) / seconds,
            "slow_per_s": (asyncio.run(fetchval(url, SLOW_DONE)) - slow_before) / seconds,
            "loadavg": [load_before, os.getloadavg()[0]],
            "exactly_once": drained["processed"] == drained["effects"] == args.drain
            and offered["processed"] == offered["effects"] == load["acked"],
        }
    return facts


def spread(values: list[float], digits: int = 0) -> str:
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    runs: list[dict[str, Any]] = []
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-isolation-") as tmp:
        work = Path(tmp)
        url = asyncio.run(pg.create_database("bench_isolation"))
        asyncio.run(migrate(url))
        toml = TOML.format(handler=HANDLERS[args.handler])
        env = environment(url, work, "isolation", toml, args.log_level)
        for round_ in range(args.rounds):
            for backlog in (False, True) if round_ % 2 == 0 else (True, False):
                run = cell(url, env, work, args, backlog) | {"round": round_ + 1}
                runs.append(run)
                print(
                    f"round {round_ + 1}: {'beside' if backlog else 'alone '} "
                    f"drain {run['drain_per_s']:6.0f} msgs/s, at {args.rate:g}/s "
                    f"{run['processed_per_s']:6.0f} msgs/s p99 {run['p99_ms']:7.1f} ms "
                    f"(p50 {run['p50_ms']:.1f}), claims {run['claims_per_s']:.0f}/s "
                    f"(of a's {run['a_claims_per_s']:.1f}/s), "
                    f"a's destination {run['slow_per_s']:.2f}/s, load {run['loadavg']}, "
                    f"exactly once: {run['exactly_once']}",
                    flush=True,
                )
        asyncio.run(pg.drop_database(url))
    alone = [r for r in runs if not r["beside"]]
    beside = [r for r in runs if r["beside"]]
    print()
    ratios: dict[str, float] = {}
    for name in ("drain_per_s", "processed_per_s", "p99_ms"):
        a, b = [r[name] for r in alone], [r[name] for r in beside]
        ratios[name] = statistics.median(b) / statistics.median(a)
        by_round = ", ".join(f"{y / x:.2f}" for x, y in zip(a, b, strict=True))
        print(
            f"{name:16} alone {spread(a)}, beside {spread(b)}: "
            f"ratio {ratios[name]:.2f} (by round {by_round})"
        )
    met = (
        ratios["drain_per_s"] >= 1 - TARGET
        and ratios["processed_per_s"] >= 1 - TARGET
        and ratios["p99_ms"] <= 1 + TARGET
    )
    a_claims = [r["a_claims_per_s"] for r in beside]
    slow = ", ".join(f"{r['slow_per_s']:.2f}" for r in beside)
    print(
        f"a's claims a second beside: {spread(a_claims, 1)}; its destination's runs a "
        f"second: {slow} (limit {RATE_LIMIT:g})"
    )
    too_fast = [r for r in beside if r["slow_per_s"] > RATE_LIMIT * 1.1]
    print(f"target: within {TARGET:.0%}: {'met' if met else 'MISSED'}")
    print(f"load average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"isolation-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"runs": runs, "ratios": ratios, "args": vars(args)}, indent=2))
    print(f"results: {out}")
    if too_fast or not all(r["exactly_once"] for r in runs):
        sys.exit(2)


if __name__ == "__main__":
    main()
