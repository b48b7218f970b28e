"""An open-loop HTTP load generator: POSTs deliveries on a fixed schedule, whatever the answers.

wrk (closed loop) sends the next request when an answer comes back, so a slow server is
offered less load. Here request n is due at `start + n / rate`; it goes out on an idle
keep-alive connection, or a new one (up to `--max-connections`), and its latency counts from
when it was due, so a server falling behind shows up as latency, not as a lower rate.

    python -m bench.openloop --url http://127.0.0.1:8000/webhooks/bench --rate 1000 \
        --duration 20 --prefix l --acked acked.txt

Prints one JSON document: what was offered and achieved, per-second counts, latencies.
A minimal HTTP/1.1 client (an asyncio protocol per connection, no task per request) keeps
the generator's own cost small (65-80 us of CPU a request at 2,500/s), so that on a 2-core
machine it takes little CPU from the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
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
    slowest: dict[int, float] = field(default_factory=dict)  # per second: the longest latency
    send_lag: list[float] = field(default_factory=list)  # seconds between due and written
    acked_ids: list[str] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


# Below uvicorn's keep-alive timeout (`webhook-inbox serve`: 5 s): a connection idle longer
# is closed here rather than found closed by the server when it is used.
MAX_IDLE_SECONDS = 3.0

# The shortest wait between sends: requests due meanwhile go out together, up to this late.
MIN_SLEEP = 0.001

# A request whose connection closes before any byte of an answer goes again on a fresh
# connection (the server's keep-alive timeout closed it meanwhile; the server never saw it),
# at most this many times in all.
ATTEMPTS = 3


@dataclass(eq=False)
class Request:
    second: int  # of the schedule, for the per-second counts
    due: float
    message_id: str
    data: bytes
    attempts: int = 0
    written: float = 0.0


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time: written whole, its answer read by
    Content-Length. A protocol rather than streams and a task per request: the generator
    shares the server's two cores, and every microsecond it spends is taken from the server."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.transport: asyncio.Transport | None = None
        self.request: Request | None = None
        self.answered = False  # a byte of the current request's answer arrived
        self.buffer = bytearray()
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.generator.idle(self)

    def send(self, request: Request) -> None:
        assert self.transport is not None
        self.request, self.answered = request, False
        request.attempts += 1
        request.written = time.perf_counter()
        self.transport.write(request.data)

    def data_received(self, data: bytes) -> None:
        self.answered = True
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and "close" in value.lower():
                close = True
        if len(self.buffer) < end + 4 + length:
            return
        del self.buffer[: end + 4 + length]
        request, self.request = self.request, None
        if request is not None:
            self.generator.answered(request, int(lines[0].split(" ", 2)[1]))
        if close:
            self.close()
        else:
            self.generator.idle(self)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        request, self.request = self.request, None
        self.generator.lost(self, request, self.answered)


class Generator:
    """Due requests go out on idle keep-alive connections, or new ones up to `limit`;
    requests that find neither wait, in order, for the next connection to come free."""

    def __init__(self, host: str, port: int, limit: int, timeout: float, stats: Stats) -> None:
        self.host, self.port, self.limit, self.timeout = host, port, limit, timeout
        self.stats = stats
        self.loop = asyncio.get_running_loop()
        self.idle_connections: list[Connection] = []
        self.busy: set[Connection] = set()
        self.waiting: deque[Request] = deque()
        self.open = 0
        self.peak = 0
        self.outstanding = 0  # requests neither answered nor failed yet
        self.all_done = asyncio.Event()

    def submit(self, request: Request) -> None:
        self.outstanding += 1
        self.all_done.clear()
        self.stats.sent[request.second] += 1
        self.dispatch(request)

    def dispatch(self, request: Request) -> None:
        now = time.perf_counter()
        while self.idle_connections:
            connection = self.idle_connections.pop()
            if now - connection.idle_since < MAX_IDLE_SECONDS:
                self.busy.add(connection)
                connection.send(request)
                return
            connection.close()
        self.waiting.append(request)
        if self.open < self.limit:
            self.connect()

    def connect(self) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)
        task = self.loop.create_task(
            self.loop.create_connection(lambda: Connection(self), self.host, self.port)
        )
        task.add_done_callback(self._connect_done)

    def _connect_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self.open -= 1
        if self.waiting:  # the request that asked for it fails: a refused connection
            self.fail(self.waiting.popleft(), task.exception())

    def idle(self, connection: Connection) -> None:
        self.busy.discard(connection)
        if self.waiting:
            self.busy.add(connection)
            connection.send(self.waiting.popleft())
        else:
            connection.idle_since = time.perf_counter()
            self.idle_connections.append(connection)

    def lost(self, connection: Connection, request: Request | None, answered: bool) -> None:
        self.open -= 1
        self.busy.discard(connection)
        with contextlib.suppress(ValueError):
            self.idle_connections.remove(connection)
        if request is None:
            return
        if not answered and request.attempts < ATTEMPTS:
            self.waiting.appendleft(request)  # went nowhere: again, first in line
            if self.open < self.limit:
                self.connect()
        else:
            self.fail(request, ConnectionError("the server closed the connection"))

    def answered(self, request: Request, status: int) -> None:
        stats, second = self.stats, request.second
        stats.statuses[status] += 1
        latency = time.perf_counter() - request.due
        stats.latencies.append(latency)
        stats.slowest[second] = max(latency, stats.slowest.get(second, 0.0))
        stats.send_lag.append(request.written - request.due)
        if 200 <= status < 300:
            stats.acked[second] += 1
            stats.acked_ids.append(request.message_id)
        else:
            stats.non_2xx[second] += 1
        self.finish()

    def fail(self, request: Request, exc: BaseException | None) -> None:
        self.stats.errors[request.second] += 1
        if len(self.stats.error_samples) < 10:
            self.stats.error_samples.append(f"{type(exc).__name__}: {exc}")
        self.finish()

    def finish(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0:
            self.all_done.set()

    def expire(self) -> None:
        """Fail the requests written more than `timeout` ago (closing their connections), and
        those still waiting for one that long after they were due."""
        now = time.perf_counter()
        for connection in list(self.busy):
            request = connection.request
            if request is not None and now - request.written > self.timeout:
                connection.request = None
                self.fail(request, TimeoutError(f"no answer in {self.timeout:g}s"))
                connection.close()
        while self.waiting and now - self.waiting[0].due > self.timeout:
            self.fail(self.waiting.popleft(), TimeoutError("no connection came free"))

    def close(self) -> None:
        for connection in [*self.idle_connections, *self.busy]:
            connection.close()


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
    ids = Ids(args.prefix, args.dup, args.fail, args.flaky, args.seed)
    stats = Stats()
    generator = Generator(host, port, args.max_connections, args.timeout, stats)
    total = int(args.rate * args.duration)
    start = time.perf_counter() + 0.05
    start_epoch = time.time() + 0.05  # second s of the schedule began at start_epoch + s
    next_expiry = start + 0.5
    n = 0
    while n < total:
        now = time.perf_counter()
        # Everything due by now goes out, so a late wake-up sends a burst rather than less.
        while n < total and start + n / args.rate <= now:
            message_id = ids.next(n)
            data = build_request(url.netloc, url.path, message_id)
            generator.submit(Request(int(n / args.rate), start + n / args.rate, message_id, data))
            n += 1
        if now >= next_expiry:
            generator.expire()
            next_expiry = now + 0.5
        if n < total:
            # Not less than a millisecond: the event loop's timers are that coarse, and a
            # shorter sleep returns at once, spinning a core the server needs.
            await asyncio.sleep(max(MIN_SLEEP, start + n / args.rate - time.perf_counter()))
    offered_for = time.perf_counter() - start
    deadline = time.perf_counter() + args.timeout + 5
    while generator.outstanding and time.perf_counter() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(generator.all_done.wait(), 0.5)
        generator.expire()
    generator.close()
    if args.acked:
        Path(args.acked).write_text("".join(f"{i}\n" for i in stats.acked_ids))
    return summarise(args, stats, total, offered_for, generator.peak) | {"start_epoch": start_epoch}


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
                "slowest_ms": ms(stats.slowest.get(s)),
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
