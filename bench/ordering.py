"""bench/ordering: one processing process draining a backlog with ordering keys against the
same backlog without, in the same run (issues 52 and 63): messages per second, one-row effects.

Each round drains `--messages` messages in rotating order: unordered (no `ordering_key`),
with 1,000 distinct keys (each key's messages spread over the backlog, as interleaved
deliveries store them), and with one key (strict FIFO), each twice: with the statistics of an
empty table (ANALYZE before the backlog arrives, as after an outage) and with fresh ones
(ANALYZE after). The targets (issue 63): the 1,000-key drain at least 0.9x the unordered one,
one key at least 1,000 msgs/s, and each shape's drain the same with either statistics (ratio
of medians over rounds, reported with its rounds). Every drain must leave each message
processed with one effect, and each key's effects in acceptance order.

`--gates` drains instead from a source with every gate a handler source can have configured,
none binding (`GATES`), against the same source with none, each with either statistics;
target: at least 0.9x the drain with none.
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

from bench.fanout import add_drain_arguments, environment, timed_drain
from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres, connected
from bench.process import HANDLERS
from bench.systems import RESULTS_DIR, console_script

TARGET = 0.9
HOT_KEY_TARGET = 1_000.0
SHAPES = {"unordered": 0, "1000 keys": 1000, "1 key": 1}
ORDERED = 'ordering_key = "/key"\n'
# --gates: every gate a handler source can have, none binding: an ordering key (each message
# its own), a rate limit far above a drain (the most the configuration allows). A breaker is a
# forward's, and a pause is no configuration: the claim asks for both whatever the source.
GATES = ORDERED + 'rate_limit = "100000/s"\n'
STATISTICS = ("empty", "fresh")

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
    add_drain_arguments(parser, messages=20_000)
    parser.add_argument(
        "--gates",
        action="store_true",
        help="instead: a source with every gate configured, none binding, against none",
    )
    return parser.parse_args(argv)


async def insert(url: str, messages: int, keys: int, analyzed: str) -> float:
    """The backlog, committed at once, analyzed before it (`empty`) or after it (`fresh`)."""
    async with connected(url) as conn:
        async with conn.transaction():
            if analyzed == "empty":
                await conn.execute("ANALYZE inbox_messages")
            await conn.execute(INSERT, BODY_TEMPLATE, messages, keys)
            if analyzed == "fresh":
                await conn.execute("ANALYZE inbox_messages")
            await conn.execute("NOTIFY webhook_inbox")
        return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))


async def verify(url: str, messages: int) -> bool:
    """Every message processed with one effect, and each key's effects in id order."""
    async with connected(url) as conn:
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


def drain(
    url: str, env: dict[str, str], work: Path, messages: int, keys: int, analyzed: str
) -> dict[str, Any]:
    seconds = timed_drain(
        url, env, work / f"worker-{keys}.log", lambda: insert(url, messages, keys, analyzed)
    )
    return {
        "keys": keys,
        "statistics": analyzed,
        "messages": messages,
        "seconds": seconds,
        "rate": messages / seconds,
        "exactly_once_in_order": asyncio.run(verify(url, messages)),
    }


def shapes(args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    """Each drain's source lines (TOML's `{ordering}` slot) and its backlog's number of keys."""
    if args.gates:  # each message its own key: no message waits for another
        return {"none": ("", 0), "every gate": (GATES, args.messages)}
    return {shape: (ORDERED if keys else "", keys) for shape, keys in SHAPES.items()}


def run_rounds(
    args: argparse.Namespace, drained: dict[str, tuple[str, int]]
) -> dict[str, list[dict[str, Any]]]:
    """`--rounds` of a drain of each shape with each statistics, in rotating order."""
    handler = HANDLERS[args.handler]
    cells = [(shape, stats) for shape in drained for stats in STATISTICS]
    runs: dict[str, list[dict[str, Any]]] = {f"{s} / {t}": [] for s, t in cells}
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-ordering-") as tmp:
        work = Path(tmp)
        url = asyncio.run(pg.create_database("bench_ordering"))
        envs = {
            shape: environment(
                url,
                work,
                shape.replace(" ", "-"),
                TOML.format(ordering=lines, handler=handler),
                args.log_level,
            )
            for shape, (lines, _) in drained.items()
        }
        subprocess.run(
            [*console_script("webhook-inbox"), "migrate"],
            env=next(iter(envs.values())),
            check=True,
            capture_output=True,
        )
        for round_ in range(args.rounds):
            shift = round_ % len(cells)
            for shape, stats in cells[shift:] + cells[:shift]:
                run = drain(url, envs[shape], work, args.messages, drained[shape][1], stats)
                runs[f"{shape} / {stats}"].append(run)
                print(
                    f"round {round_ + 1}: {shape:10} {stats:5} statistics {run['rate']:7.0f} "
                    f"msgs/s in order, once: {run['exactly_once_in_order']}",
                    flush=True,
                )
        asyncio.run(pg.drop_database(url))
    return runs


def ratio_by_round(
    runs: dict[str, list[dict[str, Any]]], cell: str, base: str
) -> tuple[float, str]:
    """`cell`'s median rate over `base`'s, and each round's pair's ratio, as text."""
    ratio = statistics.median(r["rate"] for r in runs[cell]) / statistics.median(
        r["rate"] for r in runs[base]
    )
    pairs = zip(runs[cell], runs[base], strict=True)
    return ratio, "by round " + ", ".join(f"{a['rate'] / b['rate']:.2f}" for a, b in pairs)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    drained = shapes(args)
    runs = run_rounds(args, drained)
    medians = {cell: statistics.median(r["rate"] for r in rs) for cell, rs in runs.items()}
    print()
    for cell, rate in medians.items():
        rates = ", ".join(f"{r['rate']:.0f}" for r in runs[cell])
        print(f"{cell:24}: {rate:6.0f} msgs/s (median of {rates})")
    base, measured = list(drained)[:2]
    met = []
    for stats in STATISTICS:
        ratio, rounds = ratio_by_round(runs, f"{measured} / {stats}", f"{base} / {stats}")
        met.append(ratio >= TARGET)
        line = f"{stats} statistics: {measured} / {base} {ratio:.2f} ({rounds}; target >= {TARGET})"
        if not args.gates:
            hot = medians[f"1 key / {stats}"]
            met.append(hot >= HOT_KEY_TARGET)
            line += f"; 1 key {hot:.0f} msgs/s (target >= {HOT_KEY_TARGET:.0f})"
        print(line)
    for shape in drained:
        same = medians[f"{shape} / empty"] / medians[f"{shape} / fresh"]
        print(f"{shape}: empty / fresh statistics {same:.2f}")
    print(f"targets: {'met' if all(met) else 'MISSED'}")
    print(f"load average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    name = "gates" if args.gates else "ordering"
    out = RESULTS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"runs": runs, "medians": medians}, indent=2))
    print(f"results: {out}")
    if not all(r["exactly_once_in_order"] for rs in runs.values() for r in rs):
        sys.exit(2)


if __name__ == "__main__":
    main()
