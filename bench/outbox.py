"""bench/outbox: the outbox's relay against a plain HTTP client, and two services talking
through it, in the same run (issue 65).

Relay: each round, `--messages` outgoing messages staged at once for one endpoint (the rows
`service.outbox` stages, signed with a whsec_ secret) are drained by one `webhook-inbox
worker` to a local sink that answers 200 at once (bench/sink); msgs/s from their commit to the
last sent mark. The baseline, in the same round and in alternating order: an
`httpx.AsyncClient` (the worker's connection limits, uvloop) POSTing the same bodies, from a
list in memory, to the same sink, with as many requests in flight as the worker has: its claim
loops x batch size, bounded by the endpoint's `breaker_failures` (a closed breaker admits no
more forwards at once than the failures it has left, across every claim in flight). The
target: relay >= 0.5x the baseline, as a ratio of medians over rounds.

Two services: each round, two `webhook-inbox serve` on two databases. A's generic source
`payments` stages one `StockReserved` a payment for its endpoint `inventory`, B's
standard-webhooks source; B's handler takes one from the sku's stock and records the effect
with its own clock. Payments go to A open-loop at `--rate` for `--seconds`; reported: B's
effects a second (first accept to last effect) and accept-to-effect p50/p99, from the
sender's wall clock when A answered to the effect's clock_timestamp().
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.fanout import environment
from bench.handlers import STOCK_DDL
from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres, connected, migrate
from bench.process import ROOT, wait_drained, wait_for_listeners
from bench.servers import Server, free_port
from bench.systems import RESULTS_DIR, console_script
from service.core.settings import Settings
from service.outbox import stage_values
from service.sources.config import EndpointConfig
from service.store.notifications import NOTIFY_CHANNEL

TARGET = 0.5
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ENDPOINT = "sink"
SKUS = 20
STOCK = 1_000_000
# The worker's HTTP client (service/worker/worker.py), which the baseline uses too.
LIMITS = httpx.Limits(max_connections=200, max_keepalive_connections=50)

RELAY_TOML = """
[endpoints.{endpoint}]
url = "{url}"
secret = "{secret}"
breaker_failures = {breaker_failures}
"""

SERVICE_A = """
[sources.payments]
kind = "generic"
id_header = "X-Message-Id"
handlers = ["bench.handlers:reserve_stock"]

[endpoints.inventory]
url = "{url}"
secret = "{secret}"
"""

SERVICE_B = """
[sources.stock]
kind = "standard-webhooks"
secrets = ["{secret}"]
handlers = ["bench.handlers:decrement_stock"]
"""

# The rows STAGE (service/store/outgoing.py) writes, all in one statement, and the NOTIFY it
# sends with each (one is enough: a worker woken claims all that is due).
STAGE_MANY = """
INSERT INTO inbox_messages (source, message_id, event_type, headers, body, content_type)
SELECT $1, key, $2, $3::jsonb, body, $4
  FROM unnest($5::text[], $6::bytea[]) AS staged(key, body)
"""
NOTIFY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', $1)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/outbox",
        description="The outbox's relay against a plain httpx client to the same sink, and "
        "accept-to-effect through two `serve` processes, on PostgreSQL (DATABASE_URL, else "
        "embedded).",
    )
    parser.add_argument(
        "--messages", type=int, default=10_000, help="outgoing messages a relay drain (10000)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the relay and its baseline (3)"
    )
    parser.add_argument(
        "--flow-rounds", type=int, default=2, help="runs of the two services' flow (2)"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="payments/s offered to A (200)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds offered (30)")
    parser.add_argument(
        "--breaker-failures",
        type=int,
        default=EndpointConfig.model_fields["breaker_failures"].default,
        help="the relay endpoint's breaker_failures, which bounds its forwards in flight "
        "(the default's: %(default)s)",
    )
    parser.add_argument("--skip-flow", action="store_true", help="only the relay and baseline")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the first relay drain's worker under cProfile and print where its time goes "
        "(that drain is slower for it; its rate is reported apart, not in the ratio)",
    )
    parser.add_argument("--log-level", default="INFO", help="the service's INBOX_LOG_LEVEL")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2,000 messages, 2 rounds, one flow of 5 s",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.rounds, args.flow_rounds, args.seconds = 2_000, 2, 1, 5.0
    return args


def in_flight(breaker_failures: int) -> tuple[int, dict[str, int]]:
    """How many forwards the worker has in flight at most, and what decides it."""
    settings = Settings()
    facts = {
        "worker_concurrency": settings.worker_concurrency,
        "worker_batch_size": settings.worker_batch_size,
        "breaker_failures": breaker_failures,
    }
    loops = settings.worker_concurrency * settings.worker_batch_size
    return min(loops, breaker_failures), facts


# Relay ------------------------------------------------------------------------------------


def outgoing(messages: int) -> list[dict[str, Any]]:
    """The staged rows, as `service.outbox.send` would stage them (`stage_values`)."""
    return [
        stage_values(
            ENDPOINT,
            json.loads(BODY_TEMPLATE.replace("{id}", f"o{n}")),
            event_type="invoice.paid",
            key=f"bench-o{n}",
            headers=None,
        )
        for n in range(messages)
    ]


async def stage(url: str, rows: list[dict[str, Any]]) -> float:
    """Insert and commit `rows` in one transaction; the database's clock at commit."""
    first = rows[0]
    assert all(
        (r["source"], r["event_type"], r["headers"], r["content_type"])
        == (first["source"], first["event_type"], first["headers"], first["content_type"])
        for r in rows
    )
    async with connected(url) as conn:
        async with conn.transaction():
            await conn.execute(
                STAGE_MANY,
                first["source"],
                first["event_type"],
                json.dumps(first["headers"]),
                first["content_type"],
                [r["message_id"] for r in rows],
                [r["body"] for r in rows],
            )
            await conn.execute(NOTIFY, first["source"])
        return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))


async def sink_stats(sink: str) -> dict[str, int]:
    async with httpx.AsyncClient() as client:
        stats: dict[str, int] = (await client.get(f"{sink}/stats")).json()
        return stats


async def relay_facts(url: str, committed: float) -> dict[str, Any]:
    async with connected(url) as conn:
        row = await conn.fetchrow(
            """
            SELECT count(*) FILTER (WHERE status = 'processed') AS processed,
                   count(*) FILTER (WHERE attempts <> 1) AS not_first_attempt,
                   extract(epoch FROM max(processed_at)) AS last
              FROM inbox_messages
            """
        )
        return {**dict(row), "seconds": float(row["last"]) - committed}


def relay(
    url: str,
    env: dict[str, str],
    work: Path,
    rows: list[dict[str, Any]],
    sink: str,
    profile: Path | None,
) -> dict[str, Any]:
    """One drain of `rows` by one `webhook-inbox worker`, stopped before this returns."""
    asyncio.run(reset(url))
    asyncio.run(sink_stats(sink))
    command = [*console_script("webhook-inbox"), "worker"]
    if profile is not None:
        command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "service", "worker"]
    with (work / "relay-worker.log").open("ab") as log:
        worker = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log)
        try:
            asyncio.run(wait_for_listeners(url, 1))
            committed = asyncio.run(stage(url, rows))
            if not asyncio.run(wait_drained(url, timeout=600)):
                raise RuntimeError("the worker did not drain the outbox in 600 s")
        finally:
            worker.terminate()
            worker.wait(60)
    facts = asyncio.run(relay_facts(url, committed))
    seen = asyncio.run(sink_stats(sink))
    return {
        "messages_per_s": len(rows) / facts["seconds"],
        "seconds": facts["seconds"],
        "sink": seen,
        "exactly_once": facts["processed"] == len(rows) == seen["requests"] == seen["keys"]
        and facts["not_first_attempt"] == 0,
    }


async def reset(url: str) -> None:
    async with connected(url) as conn:
        await conn.execute("TRUNCATE inbox_messages CASCADE")
        await conn.execute("DELETE FROM inbox_breakers")
        await conn.execute("DELETE FROM inbox_rate_limits")


async def post_all(sink: str, rows: list[dict[str, Any]], concurrency: int) -> float:
    """POST each row's body to the sink, `concurrency` at a time; the seconds it took."""
    requests = iter(rows)
    async with httpx.AsyncClient(limits=LIMITS, follow_redirects=False, timeout=30) as client:

        async def post_next() -> None:
            for row in requests:
                headers = {
                    "content-type": row["content_type"],
                    "idempotency-key": row["message_id"],
                }
                response = await client.post(f"{sink}/", content=row["body"], headers=headers)
                response.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(post_next() for _ in range(concurrency)))
        return time.perf_counter() - started


def baseline(rows: list[dict[str, Any]], sink: str, concurrency: int) -> dict[str, Any]:
    asyncio.run(sink_stats(sink))
    try:
        import uvloop
    except ImportError:
        seconds = asyncio.run(post_all(sink, rows, concurrency))
    else:
        seconds = uvloop.run(post_all(sink, rows, concurrency))
    seen = asyncio.run(sink_stats(sink))
    return {
        "messages_per_s": len(rows) / seconds,
        "seconds": seconds,
        "sink": seen,
        "exactly_once": seen["requests"] == seen["keys"] == len(rows),
    }


@contextlib.contextmanager
def sink_process(work: Path) -> Iterator[str]:
    port = free_port()
    with (work / "sink.log").open("ab") as log:
        sink = subprocess.Popen(
            [sys.executable, "-m", "bench.sink", "--port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    asyncio.run(sink_stats(url))
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or sink.poll() is not None:
                        log_path = work / "sink.log"
                        raise RuntimeError(f"the sink did not start; see {log_path}") from None
                    time.sleep(0.1)
            yield url
        finally:
            sink.terminate()
            sink.wait(10)


def print_profile(path: Path) -> None:
    print(f"\nthe worker under cProfile ({path}), by own time:")
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(25)
    print("by cumulative time:")
    stats.sort_stats("cumulative").print_stats(30)


# Two services -----------------------------------------------------------------------------


async def prepare_flow(a_url: str, b_url: str) -> None:
    async with connected(a_url) as a, connected(b_url) as b:
        await a.execute("TRUNCATE inbox_messages CASCADE")
        await b.execute("TRUNCATE inbox_messages CASCADE")
        await b.execute(STOCK_DDL)
        await b.execute("TRUNCATE bench_stock, bench_stock_effects")
        await b.executemany(
            "INSERT INTO bench_stock VALUES ($1, $2)", [(f"sku-{n}", STOCK) for n in range(SKUS)]
        )


async def pay(url: str, rate: float, seconds: float) -> dict[str, Any]:
    """Payments POSTed to A at `rate` a second (open loop: each at its time, whatever the
    answers); when each was answered 2xx, by the wall clock."""
    accepted: dict[str, float] = {}
    failed: Counter[str] = Counter()
    waits: list[float] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

        async def one(n: int, due: float) -> None:
            payment = f"p{n}"
            body = orjson.dumps({"id": payment, "sku": f"sku-{n % SKUS}", "amount": 4200})
            headers = {"x-message-id": payment, "content-type": "application/json"}
            try:
                response = await client.post("/webhooks/payments", content=body, headers=headers)
            except httpx.HTTPError as exc:
                failed[type(exc).__name__] += 1
                return
            if 200 <= response.status_code < 300:
                accepted[payment] = time.time()
                waits.append(time.perf_counter() - due)
            else:
                failed[str(response.status_code)] += 1

        total = int(rate * seconds)
        tasks = []
        start = time.perf_counter() + 0.05
        for n in range(total):
            due = start + n / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(n, due)))
        await asyncio.gather(*tasks)
    return {"accepted": accepted, "failed": dict(failed), "http_ms": quantiles(waits)}


def quantiles(seconds: list[float]) -> dict[str, float | None]:
    """p50, p99 and the largest, in ms."""
    if not seconds:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(seconds)

    def at(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 1)

    return {"p50": at(0.50), "p99": at(0.99), "max": at(1.0)}


async def wait_for_effects(b_url: str, count: int, timeout: float) -> None:
    async with connected(b_url) as conn:
        deadline = time.monotonic() + timeout
        while (done := await conn.fetchval("SELECT count(*) FROM bench_stock_effects")) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"B has {done} effects of {count} after {timeout} s")
            await asyncio.sleep(0.1)


async def flow_facts(a_url: str, b_url: str, accepted: dict[str, float]) -> dict[str, Any]:
    """Accept-to-effect per payment, and where it went: A's handler's commit, A's sent mark,
    B's accept, B's effect (the databases' clocks, the same machine's)."""
    async with connected(a_url) as a, connected(b_url) as b:
        effects = await b.fetch(
            "SELECT payment, extract(epoch FROM at) AS at FROM bench_stock_effects"
        )
        handled = {
            r["message_id"]: float(r["at"])
            for r in await a.fetch(
                "SELECT message_id, extract(epoch FROM processed_at) AS at FROM inbox_messages"
                " WHERE source = 'payments'"
            )
        }
        sent = {
            r["message_id"]: float(r["at"])
            for r in await a.fetch(
                "SELECT message_id, extract(epoch FROM processed_at) AS at FROM inbox_messages"
                " WHERE source = 'outbox:inventory' AND status = 'processed'"
            )
        }
        received = {
            r["message_id"]: float(r["at"])
            for r in await b.fetch(
                "SELECT message_id, extract(epoch FROM received_at) AS at FROM inbox_messages"
            )
        }
        stock_taken = await b.fetchval("SELECT sum($1 - count) FROM bench_stock", STOCK)
    at = {r["payment"]: float(r["at"]) for r in effects}
    latency = [at[p] - accepted[p] for p in accepted if p in at]
    stages: dict[str, list[float]] = {"a_handled": [], "a_sent": [], "b_received": []}
    for payment, when in accepted.items():
        key = f"payments:{payment}:1"  # `derived_key`: the handler's first send
        if payment in handled and key in sent and key in received:
            stages["a_handled"].append(handled[payment] - when)
            stages["a_sent"].append(sent[key] - handled[payment])
            stages["b_received"].append(received[key] - handled[payment])
    span = max(at.values()) - min(accepted.values()) if at and accepted else float("nan")
    return {
        "effects": len(effects),
        "distinct": len(at),
        "stock_taken": stock_taken,
        "effects_per_s": len(effects) / span,
        "latency_ms": quantiles(latency),
        "stages_ms": {name: quantiles(values) for name, values in stages.items()},
        "exactly_once": len(effects) == len(at) == len(accepted) == stock_taken
        and set(at) == set(accepted),
    }


def flow(
    a_url: str, b_url: str, work: Path, args: argparse.Namespace, round_: int
) -> dict[str, Any]:
    """One run of payments through A and B, each a fresh `serve`."""
    asyncio.run(prepare_flow(a_url, b_url))
    command = [*console_script("webhook-inbox"), "serve", "--no-migrate"]
    b_env = environment(b_url, work, "service-b", SERVICE_B.format(secret=SECRET), args.log_level)
    with Server("b", command, b_env, work / "b.log", sample_memory=False) as b:
        a_toml = SERVICE_A.format(url=f"{b.url}/webhooks/stock", secret=SECRET)
        a_env = environment(a_url, work, "service-a", a_toml, args.log_level)
        with Server("a", command, a_env, work / "a.log", sample_memory=False) as a:
            asyncio.run(wait_for_listeners(a_url, 1))
            asyncio.run(wait_for_listeners(b_url, 1))
            load_before = os.getloadavg()[0]
            sent = uvloop_run(pay(a.url, args.rate, args.seconds))
            accepted: dict[str, float] = sent["accepted"]
            asyncio.run(wait_for_effects(b_url, len(accepted), timeout=120))
            facts = asyncio.run(flow_facts(a_url, b_url, accepted))
    return facts | {
        "round": round_,
        "offered": int(args.rate * args.seconds),
        "accepted": len(accepted),
        "failed": sent["failed"],
        "a_http_ms": sent["http_ms"],
        "loadavg": [load_before, os.getloadavg()[0]],
    }


def uvloop_run(main: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


# The run ----------------------------------------------------------------------------------


def spread(values: list[float], digits: int = 0) -> str:
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    concurrency, decided_by = in_flight(args.breaker_failures)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    print(
        f"forwards in flight: {concurrency} = min(worker_concurrency x worker_batch_size, "
        f"breaker_failures) with {decided_by}; the baseline posts {concurrency} at a time",
        flush=True,
    )
    rows = outgoing(args.messages)
    runs: list[dict[str, Any]] = []
    flows: list[dict[str, Any]] = []
    profiled: dict[str, Any] | None = None
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-outbox-") as tmp:
        work = Path(tmp)
        url = asyncio.run(pg.create_database("bench_outbox"))
        asyncio.run(migrate(url))
        with sink_process(work) as sink:
            toml = RELAY_TOML.format(
                endpoint=ENDPOINT,
                url=f"{sink}/",
                secret=SECRET,
                breaker_failures=args.breaker_failures,
            )
            env = environment(url, work, "relay", toml, args.log_level)
            if args.profile:
                profile = Path(tempfile.gettempdir()) / f"outbox-worker-{os.getpid()}.prof"
                profiled = relay(url, env, work, rows, sink, profile)
                print(f"profiled relay: {profiled['messages_per_s']:,.0f} msgs/s", flush=True)
                print_profile(profile)
            for round_ in range(1, args.rounds + 1):
                order = ("relay", "baseline") if round_ % 2 else ("baseline", "relay")
                for kind in order:
                    if kind == "relay":
                        run = relay(url, env, work, rows, sink, None)
                    else:
                        run = baseline(rows, sink, concurrency)
                    run |= {"kind": kind, "round": round_, "loadavg": os.getloadavg()[0]}
                    runs.append(run)
                    print(
                        f"round {round_}: {kind:8} {run['messages_per_s']:7,.0f} msgs/s "
                        f"(peak connections at the sink {run['sink']['peak_connections']}), "
                        f"load {run['loadavg']:.1f}, exactly once: {run['exactly_once']}",
                        flush=True,
                    )
        asyncio.run(pg.drop_database(url))
        if not args.skip_flow:
            a_url = asyncio.run(pg.create_database("bench_outbox_a"))
            b_url = asyncio.run(pg.create_database("bench_outbox_b"))
            asyncio.run(migrate(a_url))
            asyncio.run(migrate(b_url))
            for round_ in range(1, args.flow_rounds + 1):
                facts = flow(a_url, b_url, work, args, round_)
                flows.append(facts)
                lat, stages = facts["latency_ms"], facts["stages_ms"]
                print(
                    f"round {round_}: two services at {args.rate:g}/s: "
                    f"{facts['effects_per_s']:6.1f} effects/s, accept-to-effect "
                    f"p50 {lat['p50']} ms p99 {lat['p99']} ms (max {lat['max']}); "
                    f"A's handler p50 {stages['a_handled']['p50']} ms, then B's accept p50 "
                    f"{stages['b_received']['p50']} ms, A's sent mark p50 "
                    f"{stages['a_sent']['p50']} ms; A's HTTP p99 {facts['a_http_ms']['p99']} ms; "
                    f"failed {facts['failed'] or 0}; load {facts['loadavg']}; "
                    f"exactly once: {facts['exactly_once']}",
                    flush=True,
                )
            asyncio.run(pg.drop_database(a_url))
            asyncio.run(pg.drop_database(b_url))
    relays = [r["messages_per_s"] for r in runs if r["kind"] == "relay"]
    baselines = [r["messages_per_s"] for r in runs if r["kind"] == "baseline"]
    ratios = [r / b for r, b in zip(relays, baselines, strict=True)]
    ratio = statistics.median(relays) / statistics.median(baselines)
    print()
    print(f"relay:    {spread(relays)} msgs/s (median, range over rounds)")
    print(f"baseline: {spread(baselines)} msgs/s, {concurrency} in flight")
    print(
        f"ratio {ratio:.2f} (by round {', '.join(f'{r:.2f}' for r in ratios)}); "
        f"target >= {TARGET}: {'met' if ratio >= TARGET else 'MISSED'}"
    )
    if flows:
        p50s = [f["latency_ms"]["p50"] for f in flows]
        p99s = [f["latency_ms"]["p99"] for f in flows]
        rates = [f["effects_per_s"] for f in flows]
        print(
            f"two services at {args.rate:g}/s for {args.seconds:g} s: {spread(rates, 1)} "
            f"effects/s; accept-to-effect p50 {spread(p50s, 1)} ms, p99 {spread(p99s, 1)} ms"
        )
    print(f"load average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"outbox-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {
        "args": vars(args),
        "in_flight": concurrency,
        "in_flight_from": decided_by,
        "runs": runs,
        "ratio": ratio,
        "ratios_by_round": ratios,
        "profiled": profiled,
        "flows": flows,
    }
    out.write_text(json.dumps(document, indent=2))
    print(f"results: {out}")
    if not all(r["exactly_once"] for r in [*runs, *flows]):
        sys.exit(2)


if __name__ == "__main__":
    main()
