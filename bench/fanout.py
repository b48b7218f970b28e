"""bench/fanout: a drain fanned out to three handler destinations against the same drain to
one, in the same run (issue 51): total effects per second, each a one-row effect.

Each round drains `--messages` messages twice, in alternating order: once by a source with
one handler (`handlers = [...]`, one effect a message), once by a source with three named
destinations, each running the same handler (three effects a message, each destination's
committed with its own processed mark). The ratio is the fan-out's effects per second over
the single's, as a median over rounds; the target is at least 0.7. Every drain must leave
each message processed and each (message, destination) with exactly one effect.
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
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg

from bench.pg import BenchPostgres
from bench.process import (
    HANDLERS,
    ROOT,
    SOURCES_TOML,
    insert_backlog,
    prepare,
    wait_drained,
    wait_for_listeners,
)
from bench.systems import RESULTS_DIR, console_script

TARGET = 0.7
DESTINATIONS = ("billing", "disputes", "warehouse")

FANNED = """
[sources.bench]
kind = "generic"
id_header = "X-Message-Id"
""" + "".join(
    f'\n[sources.bench.destinations.{name}]\nhandlers = ["bench.handlers:{{handler}}"]\n'
    for name in DESTINATIONS
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/fanout",
        description="Drain a backlog fanned out to 3 destinations against the same to 1.",
    )
    add_drain_arguments(parser, messages=30_000)
    return parser.parse_args(argv)


def add_drain_arguments(parser: argparse.ArgumentParser, *, messages: int) -> None:
    """The arguments of a benchmark that drains a backlog one way against another, in rounds."""
    parser.add_argument("--messages", type=int, default=messages, help=f"backlog size ({messages})")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, each of the drains compared once a round (3)"
    )
    add_handler_arguments(parser, log_level="INFO")


def add_handler_arguments(parser: argparse.ArgumentParser, *, log_level: str) -> None:
    """The effect's style and the service's log level, for a benchmark that runs handlers."""
    parser.add_argument(
        "--handler",
        default="execute",
        choices=[h for h in HANDLERS if h != "noop"],
        help="the one-row effect's style, as bench/process --handlers (execute)",
    )
    parser.add_argument(
        "--log-level", default=log_level, help=f"the service's INBOX_LOG_LEVEL ({log_level})"
    )


def environment(url: str, work: Path, name: str, toml: str, log_level: str) -> dict[str, str]:
    config = work / f"{name}.toml"
    config.write_text(toml)
    return {
        **os.environ,
        "DATABASE_URL": url,
        "INBOX_CONFIG": str(config),
        "INBOX_DATA_DIR": str(work / "inbox-data"),
        "INBOX_LOG_LEVEL": log_level,
    }


async def verify(url: str, messages: int, fanned: bool) -> dict[str, Any]:
    """Each message processed, and one effect per message and destination."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            """
            SELECT (SELECT count(*) FROM inbox_messages WHERE status = 'processed') AS processed,
                   (SELECT count(*) FROM bench_effects) AS effects,
                   (SELECT count(*) FROM inbox_destinations WHERE status = 'processed')
                       AS pairs_processed,
                   (SELECT count(*) FROM (SELECT inbox_id FROM bench_effects GROUP BY inbox_id
                                          HAVING count(*) <> $1) AS t) AS wrong_counts
            """,
            len(DESTINATIONS) if fanned else 1,
        )
        facts = dict(row)
        per = len(DESTINATIONS) if fanned else 1
        facts["exactly_once"] = (
            facts["processed"] == messages
            and facts["effects"] == per * messages
            and facts["wrong_counts"] == 0
            and facts["pairs_processed"] == (per * messages if fanned else 0)
        )
        return facts
    finally:
        await conn.close()


async def last_processed(url: str) -> float:
    conn = await asyncpg.connect(url)
    try:
        return float(
            await conn.fetchval("SELECT extract(epoch FROM max(processed_at)) FROM inbox_messages")
        )
    finally:
        await conn.close()


def timed_drain(
    url: str,
    env: dict[str, str],
    log_path: Path,
    backlog: Callable[[], Coroutine[Any, Any, float]],
) -> float:
    """Seconds one `webhook-inbox worker` takes to drain what `backlog` inserts (it returns
    the database's clock at its commit), to the last processed mark; the worker is stopped
    before this returns (bench/ordering drains the same way)."""
    asyncio.run(prepare(url))
    log = log_path.open("ab")
    worker = subprocess.Popen(
        [*console_script("webhook-inbox"), "worker"], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    try:
        asyncio.run(wait_for_listeners(url, 1))
        committed = asyncio.run(backlog())
        if not asyncio.run(wait_drained(url, timeout=900)):
            raise RuntimeError("the worker did not drain the backlog in 900 s")
        return asyncio.run(last_processed(url)) - committed
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()


def drain(url: str, env: dict[str, str], work: Path, messages: int, fanned: bool) -> dict[str, Any]:
    log_path = work / f"worker-{'fanned' if fanned else 'single'}.log"
    seconds = timed_drain(url, env, log_path, lambda: insert_backlog(url, messages, "fan-"))
    verified = asyncio.run(verify(url, messages, fanned))
    effects = messages * (len(DESTINATIONS) if fanned else 1)
    return {
        "fanned": fanned,
        "seconds": seconds,
        "messages_per_s": messages / seconds,
        "effects_per_s": effects / seconds,
        "verified": verified,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    handler = HANDLERS[args.handler]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    runs: list[dict[str, Any]] = []
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-fanout-") as tmp:
        work = Path(tmp)
        url = asyncio.run(pg.create_database("bench_fanout"))
        envs = {
            False: environment(
                url, work, "single", SOURCES_TOML.format(handler=handler), args.log_level
            ),
            True: environment(url, work, "fanned", FANNED.format(handler=handler), args.log_level),
        }
        subprocess.run(
            [*console_script("webhook-inbox"), "migrate"],
            env=envs[False],
            check=True,
            capture_output=True,
        )
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for fanned in order:
                run = drain(url, envs[fanned], work, args.messages, fanned)
                run["round"] = round_ + 1
                runs.append(run)
                shape = "3 destinations" if fanned else "1 handler     "
                print(
                    f"round {round_ + 1}: {shape} {run['messages_per_s']:7.0f} msgs/s "
                    f"{run['effects_per_s']:7.0f} effects/s "
                    f"exactly once: {run['verified']['exactly_once']}",
                    flush=True,
                )
        asyncio.run(pg.drop_database(url))
    single = [r["effects_per_s"] for r in runs if not r["fanned"]]
    fanned_rates = [r["effects_per_s"] for r in runs if r["fanned"]]
    ratios = [f / s for f, s in zip(fanned_rates, single, strict=True)]
    ratio = statistics.median(fanned_rates) / statistics.median(single)
    print()
    print(f"single destination: {statistics.median(single):.0f} effects/s (median)")
    print(f"3 destinations:     {statistics.median(fanned_rates):.0f} effects/s (median)")
    print(
        f"ratio {ratio:.2f} (by round {', '.join(f'{r:.2f}' for r in ratios)}); "
        f"target >= {TARGET}: {'met' if ratio >= TARGET else 'MISSED'}"
    )
    print(f"load average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"fanout-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"runs": runs, "ratio": ratio, "handler": args.handler}, indent=2))
    print(f"results: {out}")
    if not all(r["verified"]["exactly_once"] for r in runs):
        sys.exit(2)


if __name__ == "__main__":
    main()
