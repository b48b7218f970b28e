"""An open-loop HTTP load generator: POSTs deliveries on a fixed schedule, whatever the answers.

wrk (closed loop) sends the next request when an answer comes back, so a slow server is
offered less load. Here request n is due at `start + n / rate`; it goes out on an idle
keep-alive connection, or a new one (up to `--max-connections`), and its latency counts from
when it was due, so a server falling behind shows up as latency, not as a lower rate.

    python -m bench.openloop --url http://127.0.0.1:8000/webhooks/bench --rate 1000 \
        --duration 20 --prefix l --acked acked.txt

Prints one JSON document: what was offered and achieved, per-second counts, latencies.
A minimal HTTP/1.1 client on asyncio streams keeps the generator's own cost small (about
50 us per request), so that on a 2-core machine it takes little CPU from the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.load import BODY_TEMPLATE


@dataclass
class Stats:
    sent: Counter[int] = field(default_factory=Counter)  # per second of the schedule
    acked: Counter[int] = field(default_factory=Counter)
    non_2xx: Counter[int] = field(default_factory=Counter)
    errors: Counter[int] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # seconds, from when it was due
    send_lag: list[float] = field(default_factory=list)  # seconds between due and written
    acked_ids: list[str] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]

# Below uvicorn's keep-alive timeout (`webhook-inbox serve`: 5 s): a connection idle longer
# is closed here rather than found closed by the server when it is used.
MAX_IDLE_SECONDS = 3.0


class Pool:
    """Keep-alive connections to one host; a request takes an idle one or opens another."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port, self.limit = host, port, limit
        self.idle: list[tuple[Conn, float]] = []
        self.open = 0
        self.peak = 0
        self.freed = asyncio.Condition()

    async def acquire(self, fresh: bool = False) -> Conn:
        while True:
            while self.idle and not fresh:
                conn, since = self.idle.pop()
                if time.monotonic() - since < MAX_IDLE_SECONDS:
                    return conn
                self.open -= 1
                conn[1].close()
            if self.open < self.limit:
                self.open += 1
                self.peak = max(self.peak, self.open)
                try:
                    return await asyncio.open_connection(self.host, self.port)
                except BaseException:
                    self.open -= 1
                    raise
            async with self.freed:
                await self.freed.wait()

    async def release(self, conn: Conn, reusable: bool) -> None:
        if reusable:
            self.idle.append((conn, time.monotonic()))
        else:
            self.open -= 1
            conn[1].close()
        async with self.freed:
            self.freed.notify()

    def close(self) -> None:
        for (_, writer), _ in self.idle:
            writer.close()


async def post(pool: Pool, request: bytes) -> tuple[int, float]:
    """Status and when the request was written. A kept-alive connection the server closed
    meanwhile (its keep-alive timeout) fails before any byte of an answer: then the request
    goes again on a fresh connection, as HTTP clients do; the server never saw it."""
    for attempt in range(3):
        conn = await pool.acquire(fresh=attempt > 0)
        try:
            return await exchange(pool, conn, request)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
        except ConnectionResetError:
            pass
    raise ConnectionError("the server closed three connections without answering")


async def exchange(pool: Pool, conn: Conn, request: bytes) -> tuple[int, float]:
    reader, writer = conn
    reusable = False
    try:
        written = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and "close" in value.lower():
                close = True
        if length:
            await reader.readexactly(length)
        reusable = not close
        return status, written
    finally:
        await pool.release(conn, reusable)


def build_request(host: str, path: str, message_id: str) -> bytes:
    body = BODY_TEMPLATE.replace("{id}", message_id).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"X-Message-Id: {message_id}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Ids:
    """The id of each request: new (ok, fail or flaky by the given fractions) or a duplicate."""

    def __init__(self, prefix: str, dup: float, fail: float, flaky: float, seed: int) -> None:
        self.prefix, self.dup, self.fail, self.flaky = prefix, dup, fail, flaky
        self.random = random.Random(seed)
        self.issued: list[str] = []

    def next(self, n: int) -> str:
        r = self.random
        if self.issued and r.random() < self.dup:
            return r.choice(self.issued)
        x = r.random()
        kind = "fail" if x < self.fail else "flaky" if x < self.fail + self.flaky else "ok"
        message_id = f"{self.prefix}-{kind}-{n}"
        self.issued.append(message_id)
        return message_id


async def run(args: argparse.Namespace) -> dict[str, Any]:
    url = urlsplit(args.url)
    host = url.hostname or "127.0.0.1"
    port = url.port or 80
    pool = Pool(host, port, args.max_connections)
    ids = Ids(args.prefix, args.dup, args.fail, args.flaky, args.seed)
    stats = Stats()
    total = int(args.rate * args.duration)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def one(n: int, due: float, message_id: str) -> None:
        second = int(n / args.rate)
        stats.sent[second] += 1
        try:
            status, written = await asyncio.wait_for(
                post(pool, build_request(url.netloc, url.path, message_id)), args.timeout
            )
        except Exception as exc:  # a refused connection, a timeout, a reset: all errors
            stats.errors[second] += 1
            if len(stats.error_samples) < 10:
                stats.error_samples.append(f"{type(exc).__name__}: {exc}")
            return
        stats.statuses[status] += 1
        stats.latencies.append(time.perf_counter() - due)
        stats.send_lag.append(written - due)
        if 200 <= status < 300:
            stats.acked[second] += 1
            stats.acked_ids.append(message_id)
        else:
            stats.non_2xx[second] += 1

    start = time.perf_counter() + 0.05
    n = 0
    while n < total:
        now = time.perf_counter()
        # Everything due by now goes out, so a late wake-up sends a burst rather than less.
        while n < total and start + n / args.rate <= now:
            task = loop.create_task(one(n, start + n / args.rate, ids.next(n)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if n < total:
            await asyncio.sleep(max(0.0, start + n / args.rate - time.perf_counter()))
    offered_for = time.perf_counter() - start
    if tasks:
        await asyncio.wait(tasks, timeout=args.timeout + 5)
    pool.close()
    if args.acked:
        Path(args.acked).write_text("".join(f"{i}\n" for i in stats.acked_ids))
    return summarise(args, stats, total, offered_for, pool.peak)


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def summarise(
    args: argparse.Namespace, stats: Stats, total: int, offered_for: float, peak: int
) -> dict[str, Any]:
    seconds = max([*stats.sent, 0]) + 1
    return {
        "target_rate": args.rate,
        "requests": total,
        "offered_seconds": round(offered_for, 3),
        "achieved_rate": round(total / offered_for, 1) if offered_for else 0.0,
        "acked": sum(stats.acked.values()),
        "non_2xx": sum(stats.non_2xx.values()),
        "errors": sum(stats.errors.values()),
        "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
        "error_samples": stats.error_samples,
        "latency_ms": {
            f"p{p}": ms(percentile(stats.latencies, p)) for p in (50, 90, 99, 99.9, 100)
        },
        "send_lag_ms": {f"p{p}": ms(percentile(stats.send_lag, p)) for p in (50, 99, 100)},
        "late_over_10ms": sum(1 for lag in stats.send_lag if lag > 0.010),
        "peak_connections": peak,
        "per_second": [
            {
                "second": s,
                "sent": stats.sent[s],
                "acked": stats.acked[s],
                "non_2xx": stats.non_2xx[s],
                "errors": stats.errors[s],
            }
            for s in range(seconds)
        ],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.openloop", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of schedule")
    parser.add_argument("--prefix", default="ol", help="message ids start with this")
    parser.add_argument("--dup", type=float, default=0.0, help="fraction resending an old id")
    parser.add_argument("--fail", type=float, default=0.0, help="fraction of `-fail-` ids")
    parser.add_argument("--flaky", type=float, default=0.0, help="fraction of `-flaky-` ids")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-connections", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    parser.add_argument("--acked", help="write every 2xx id here, one a line")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
