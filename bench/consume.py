"""bench/consume: one `webhook-inbox consume` process's rate into the inbox against the same
broker's own client draining the same queue with plain acks, in the same run (issue 54).

Each round, three cells in alternating order, each on a fresh queue pre-filled with
`--messages` JSON bodies carrying the producer's id (`message_id = "/id"`):

- baseline: the broker's async client (aio-pika, nats-py, redis.asyncio) in this process on
  uvloop, `--prefetch` unacked at most, each message's id read and the message acked; msgs/s
  from the first ack to the last.
- consume: one `webhook-inbox consume` for a source without handlers (rows stored processed);
  msgs/s from the first row's `received_at` to the last's.
- handler: the same source with a one-row handler (bench/handlers.py), which runs in one
  `webhook-inbox worker` beside the consumer; effects/s from the first row's `received_at` to
  the last effect's clock_timestamp(), and the consumer's own rate as above.

Every cell must take each id once (one row per id, each a first receipt, and one effect each
for the handler cell) and leave the queue empty, or the run exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psutil

from bench.brokers import BROKERS, Broker
from bench.fanout import environment
from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres, connected, migrate
from bench.process import (
    HANDLERS,
    ROOT,
    add_effect_arguments,
    prepare,
    start_py_spy,
    wait_drained,
    wait_for_listeners,
)
from bench.profile import analyse
from bench.systems import RESULTS_DIR, console_script
from service.sources.brokers import BrokerConfig

CELLS = ("baseline", "consume", "handler")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/consume",
        description="One `webhook-inbox consume` into the inbox (no handler, then a one-row "
        "handler run by a worker) against the broker's own client draining with plain acks, "
        "on PostgreSQL (DATABASE_URL, else embedded).",
    )
    parser.add_argument(
        "--broker",
        default="rabbitmq",
        choices=[*BROKERS, "all"],
        help="the broker to read from, at RABBITMQ_URL, NATS_URL or REDIS_URL, else the local "
        "default (rabbitmq)",
    )
    parser.add_argument("--messages", type=int, default=20_000, help="messages a cell (20000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three cells (3)")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=BrokerConfig.model_fields["prefetch"].default,
        help="unacked messages at most, on both sides (the source's default: %(default)s)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="first run one consume cell with its consumer recorded by py-spy (PY_SPY or on "
        "PATH) and print where its time goes (its rate is reported apart, not in the ratio)",
    )
    add_effect_arguments(parser, log_level="INFO")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 messages, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.rounds = 2_000, 2
    return args


def bodies(prefix: str, count: int) -> tuple[list[str], list[bytes]]:
    ids = [f"{prefix}{n}" for n in range(count)]
    return ids, [BODY_TEMPLATE.replace("{id}", i).encode() for i in ids]


def source_toml(broker: Broker, key: str, prefetch: int, handler: str | None) -> str:
    toml = "[sources.bench]\n" + broker.source_table(key, prefetch) + 'message_id = "/id"\n'
    if handler is not None:
        toml += f'handlers = ["bench.handlers:{handler}"]\n'
    return toml


def busy_cores() -> Callable[[float], float]:
    """The machine's cores kept busy from now until the returned function is called with
    the seconds that passed."""
    before = psutil.cpu_times()

    def since(seconds: float) -> float:
        after = psutil.cpu_times()
        idle = (after.idle + after.iowait) - (before.idle + before.iowait)
        return (sum(after) - sum(before) - idle) / max(seconds, 1e-9)

    return since


# The cells --------------------------------------------------------------------------------


def baseline(broker: Broker, key: str, ids: list[str], prefetch: int) -> dict[str, Any]:
    import uvloop

    drained = uvloop.run(broker.drain(key, len(ids), prefetch))
    left = asyncio.run(broker.left(key))
    return {
        "messages_per_s": len(ids) / drained.seconds,
        "seconds": drained.seconds,
        "cpu_us_per_message": drained.cpu_seconds / len(ids) * 1e6,
        "left_on_broker": left,
        "exactly_once": sorted(drained.ids) == sorted(ids) and left == 0,
    }


async def count_rows(url: str, handler: bool) -> int:
    async with connected(url) as conn:
        table = "bench_effects" if handler else "inbox_messages"
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))


def wait_for(
    what: Callable[[], Coroutine[Any, Any, int]],
    target: int,
    processes: list[subprocess.Popen[bytes]],
    timeout: float,
) -> tuple[float | None, float]:
    """Poll `what` until it reaches `target`; the CPU seconds of `processes[0]` when the first
    appeared (None if all came at once), and when the last did."""
    consumer = psutil.Process(processes[0].pid)
    started: float | None = None
    deadline = time.monotonic() + timeout
    while (done := asyncio.run(what())) < target:
        if started is None and done > 0:
            started = sum(consumer.cpu_times()[:2])
        if any(p.poll() is not None for p in processes):
            raise RuntimeError(f"a process exited with {done} of {target} done")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{done} of {target} after {timeout} s")
        time.sleep(0.1)
    return started, sum(consumer.cpu_times()[:2])


async def stored_facts(url: str, ids: list[str], handler: bool) -> dict[str, Any]:
    async with connected(url) as conn:
        rows = await conn.fetch("SELECT message_id, receive_count, status FROM inbox_messages")
        span = await conn.fetchrow(
            """
            SELECT extract(epoch FROM min(received_at)) AS first,
                   extract(epoch FROM max(received_at)) AS last,
                   (SELECT extract(epoch FROM max(at)) FROM bench_effects) AS last_effect,
                   (SELECT count(*) FROM bench_effects) AS effects,
                   (SELECT count(DISTINCT inbox_id) FROM bench_effects) AS distinct_effects,
                   count(DISTINCT received_at) AS commits
              FROM inbox_messages
            """
        )
    stored = sorted(r["message_id"] for r in rows)
    facts: dict[str, Any] = {
        "rows": len(rows),
        "receipts": sum(r["receive_count"] for r in rows),
        "processed": sum(r["status"] == "processed" for r in rows),
        "effects": span["effects"],
        "consume_seconds": float(span["last"]) - float(span["first"]),
        # Each group commit is one autocommitted statement, whose rows share its now().
        "group_commits": span["commits"],
    }
    facts["ids_once"] = stored == sorted(ids) and facts["receipts"] == len(ids)
    if handler:
        facts["effect_seconds"] = float(span["last_effect"]) - float(span["first"])
        facts["ids_once"] = facts["ids_once"] and (
            span["effects"] == span["distinct_effects"] == len(ids)
        )
    facts["ids_once"] = facts["ids_once"] and facts["processed"] == len(ids)
    return facts


def consume(
    broker: Broker,
    key: str,
    ids: list[str],
    url: str,
    work: Path,
    args: argparse.Namespace,
    *,
    handler: bool,
    profile: Path | None = None,
) -> dict[str, Any]:
    """One `webhook-inbox consume` (and, for the handler cell, one `worker`) over the filled
    queue `key`, stopped before this returns."""
    asyncio.run(prepare(url))
    name = HANDLERS[args.handler] if handler else None
    toml = source_toml(broker, key, args.prefetch, name)
    env = environment(url, work, key, toml, args.log_level)
    command = [*console_script("webhook-inbox"), "consume"]
    processes: list[subprocess.Popen[bytes]] = []
    spy: subprocess.Popen[bytes] | None = None
    with (work / f"{key}.log").open("ab") as log:
        try:
            if handler:
                worker = [*console_script("webhook-inbox"), "worker"]
                processes.append(
                    subprocess.Popen(worker, env=env, cwd=ROOT, stdout=log, stderr=log)
                )
                asyncio.run(wait_for_listeners(url, 1))
            consumer = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log)
            processes.insert(0, consumer)
            # The queue is full already: the first second or so (the consumer's start) is
            # not recorded, the rest is.
            spy = start_py_spy(consumer.pid, profile) if profile is not None else None
            cores = busy_cores()
            began = time.monotonic()
            cpu_first, cpu_last = wait_for(
                lambda: count_rows(url, handler), len(ids), processes, timeout=600
            )
            machine = cores(time.monotonic() - began)
            if handler and not asyncio.run(wait_drained(url, timeout=60)):
                raise RuntimeError("the worker left messages pending")
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(60)
    left = asyncio.run(broker.left(key))
    facts = asyncio.run(stored_facts(url, ids, handler))
    run: dict[str, Any] = {
        "messages_per_s": len(ids) / facts["consume_seconds"],
        "seconds": facts["consume_seconds"],
        "consumer_cpu_us_per_message": (cpu_last - (cpu_first or cpu_last)) / len(ids) * 1e6,
        "machine_busy_cores": machine,
        "left_on_broker": left,
        "stored": facts,
        "exactly_once": facts["ids_once"] and left == 0,
    }
    if handler:
        run["effects_per_s"] = len(ids) / facts["effect_seconds"]
    return run


# The run ----------------------------------------------------------------------------------


def spread(values: list[float], digits: int = 0) -> str:
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def run_broker(broker: Broker, url: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    profiled: dict[str, Any] | None = None
    tag = f"bench-consume-{os.getpid()}"
    if args.profile:
        key = f"{tag}-profiled"
        ids, payloads = bodies("p-", args.messages)
        asyncio.run(broker.fill(key, payloads))
        path = work / f"consume-{broker.name}.collapsed"
        try:
            profiled = consume(broker, key, ids, url, work, args, handler=False, profile=path)
        finally:
            asyncio.run(broker.remove(key))
        print(f"profiled consume: {profiled['messages_per_s']:,.0f} msgs/s", flush=True)
        print(f"the consumer, recorded by py-spy:\n{analyse(path)}\n", flush=True)
    for round_ in range(1, args.rounds + 1):
        order = CELLS if round_ % 2 else tuple(reversed(CELLS))
        for cell in order:
            key = f"{tag}-{round_}-{cell}"
            ids, payloads = bodies(f"r{round_}-{cell}-", args.messages)
            asyncio.run(broker.fill(key, payloads))
            load = os.getloadavg()[0]
            try:
                if cell == "baseline":
                    run = baseline(broker, key, ids, args.prefetch)
                else:
                    run = consume(broker, key, ids, url, work, args, handler=cell == "handler")
            finally:
                asyncio.run(broker.remove(key))
            run |= {"cell": cell, "round": round_, "loadavg": [load, os.getloadavg()[0]]}
            runs.append(run)
            print(f"{broker.name} round {round_}: {describe(run)}", flush=True)
    return summarize(broker.name, runs) | {"runs": runs, "profiled": profiled}


def describe(run: dict[str, Any]) -> str:
    cell = run["cell"]
    text = f"{cell:8} {run['messages_per_s']:7,.0f} msgs/s"
    if cell == "baseline":
        text += f" ({run['cpu_us_per_message']:.0f} us CPU a message)"
    else:
        text += (
            f" (the consumer's CPU {run['consumer_cpu_us_per_message']:.0f} us a message, "
            f"{run['stored']['rows'] / run['stored']['group_commits']:.1f} a group commit, "
            f"{run['machine_busy_cores']:.1f} cores busy)"
        )
    if cell == "handler":
        text += f", effects {run['effects_per_s']:7,.0f}/s"
    load = run["loadavg"]
    return f"{text}, load {load[0]:.1f}-{load[1]:.1f}, exactly once: {run['exactly_once']}"


def summarize(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def rates(cell: str, key: str = "messages_per_s") -> list[float]:
        return [r[key] for r in runs if r["cell"] == cell]

    base = rates("baseline")
    if not base:  # --rounds 0: a profile only
        return {"broker": name, "rates": {}, "ratios": {}}
    figures = {
        "baseline": base,
        "consume": rates("consume"),
        "handler_consume": rates("handler"),
        "handler_effects": rates("handler", "effects_per_s"),
    }
    ratios = {
        cell: {
            "ratio": statistics.median(values) / statistics.median(base),
            "by_round": [v / b for v, b in zip(values, base, strict=True)],
        }
        for cell, values in figures.items()
        if cell != "baseline"
    }
    return {"broker": name, "rates": figures, "ratios": ratios}


def print_summary(summary: dict[str, Any]) -> None:
    rates, ratios = summary["rates"], summary["ratios"]
    if not rates:
        return
    print(f"\n{summary['broker']} (median over rounds, range):")
    labels = {
        "baseline": "baseline (client, plain ack)",
        "consume": "consume, no handler",
        "handler_consume": "consume, one-row handler",
        "handler_effects": "  its effects (worker)",
    }
    for cell, label in labels.items():
        line = f"  {label:30} {spread(rates[cell]):>26} msgs/s"
        if cell in ratios:
            by_round = ", ".join(f"{r:.2f}" for r in ratios[cell]["by_round"])
            line += f"  {ratios[cell]['ratio']:.2f}x the baseline (by round {by_round})"
        print(line)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = list(BROKERS) if args.broker == "all" else [args.broker]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    summaries: list[dict[str, Any]] = []
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-consume-") as tmp:
        work = Path(tmp)
        url = asyncio.run(pg.create_database("bench_consume"))
        asyncio.run(migrate(url))
        for name in names:
            summaries.append(run_broker(BROKERS[name](), url, work, args))
        asyncio.run(pg.drop_database(url))
    for summary in summaries:
        print_summary(summary)
    print(f"load average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"consume-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "brokers": summaries}, indent=2))
    print(f"results: {out}")
    if not all(r["exactly_once"] for s in summaries for r in s["runs"]):
        sys.exit(2)


if __name__ == "__main__":
    main()
