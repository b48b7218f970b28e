"""bench/backlog: recovery after an outage (issue 70). A backlog of 20,000 and one of
1,000,000 pending messages, filled in SQL with bench/process's shape before any worker runs,
each drained by one `webhook-inbox worker` with a one-row handler, in the same run.

Reported: each drain's rate (messages over the span from the worker's start to the last
effect), the large one's as a ratio to the small ones' (target >= 0.8), its rate over time in
5 s windows (target: no stretch below 0.5x the small rate longer than 10 s), the most dead
tuples autovacuum let `inbox_messages` and `inbox_claims` hold and how often it ran, and the
worker's peak memory. Every run starts from an empty table (restartable, not resumable).

`--ingest` (issue 70 item 2) measures ingest instead: a `serve --no-worker` process taking
deliveries over HTTP, idle and while one `webhook-inbox worker` drains a backlog of
`--ingest-backlog` (800,000) under each of `--worker-settings` (by default niceness 0 and 10),
in alternating phases of the same run: each phase's closed-loop rate (wrk) and open-loop
latency at `--rate` (bench/openloop), as bench/process reads them. Targets: while it drains,
p99 < 50 ms and a rate at least 0.5x the idle one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.fanout import add_handler_arguments, environment
from bench.load import BODY_TEMPLATE, ensure_wrk, run_wrk, write_requests
from bench.pg import BenchPostgres
from bench.process import (
    HANDLERS,
    INSERT_BACKLOG,
    SOURCES_TOML,
    openloop,
    prepare,
    wait_for_listeners,
)
from bench.servers import MemorySampler, Server
from bench.systems import RESULTS_DIR, console_script

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.8
FLOOR, FLOOR_SECONDS, WINDOW = 0.5, 10.0, 5.0
FILL_CHUNK = 250_000
INGEST_P99_MS, INGEST_RATIO = 50.0, 0.5
# wrk's requests are written ahead, this many per second of a phase (this machine's idle
# ingest has served 10-11 k/s).
MAX_RPS = 24_000

# Sampled once a second while a drain runs: the effects so far (their identity's last value,
# not a count of a million rows), and the dead tuples and autovacuums of the churning tables.
SAMPLE = """
SELECT extract(epoch FROM clock_timestamp()) AS at,
       (SELECT coalesce(max(id), 0) FROM bench_effects) AS effects,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'inbox_messages') AS dead_m,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'inbox_claims') AS dead_c,
       (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'inbox_messages')
           AS vacuums_m,
       (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'inbox_claims')
           AS vacuums_c
"""


def migrated(pg: BenchPostgres, work: Path, args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The bench's database, migrated, and the environment a worker or `serve` runs in."""
    url = asyncio.run(pg.create_database("bench_backlog"))
    env = environment(
        url, work, "backlog", SOURCES_TOML.format(handler=HANDLERS[args.handler]), args.log_level
    )
    command = [*console_script("webhook-inbox"), "migrate"]
    subprocess.run(command, env=env, check=True, capture_output=True)
    return url, env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/backlog",
        description="Drain a 20,000 and a 1,000,000 backlog with one worker, in the same run.",
    )
    parser.add_argument("--small", type=int, default=20_000, help="small backlog (20000)")
    parser.add_argument("--large", type=int, default=1_000_000, help="large backlog (1000000)")
    parser.add_argument(
        "--small-runs", type=int, default=3, help="small drains, before and after the large (3)"
    )
    add_handler_arguments(parser, log_level="WARNING")
    ingest = parser.add_argument_group("--ingest: ingest idle and while a backlog drains")
    ingest.add_argument("--ingest", action="store_true", help="measure ingest, not the drains")
    ingest.add_argument(
        "--ingest-backlog", type=int, default=800_000, help="the backlog drained (800000)"
    )
    ingest.add_argument("--rounds", type=int, default=3, help="idle and draining phases (3)")
    ingest.add_argument("--duration", type=float, default=10.0, help="seconds of load (10)")
    ingest.add_argument("--rate", type=float, default=1000.0, help="open-loop rate/s (1000)")
    ingest.add_argument("--connections", type=int, default=32, help="wrk connections (32)")
    ingest.add_argument(
        "--worker-settings",
        nargs="+",
        default=["INBOX_WORKER_NICE=0", "INBOX_WORKER_NICE=10"],
        help="the draining worker's settings, one draining phase each per round, as "
        "INBOX_NAME=value[,...] (INBOX_WORKER_NICE=0 INBOX_WORKER_NICE=10)",
    )
    return parser.parse_args(argv)


async def fill(url: str, messages: int, prefix: str) -> None:
    """`messages` pending messages, committed `FILL_CHUNK` at a time, progress printed."""
    conn = await asyncpg.connect(url)
    try:
        started = time.monotonic()
        for first in range(0, messages, FILL_CHUNK):
            count = min(FILL_CHUNK, messages - first)
            chunk = INSERT_BACKLOG.replace(
                "generate_series(1, $3)", f"generate_series({first + 1}, {first} + $3)"
            )
            await conn.execute(chunk, prefix, BODY_TEMPLATE, count)
            print(
                f"  filled {first + count:,} of {messages:,} ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    finally:
        await conn.close()


class Sampler:
    """SAMPLE once a second on a thread of its own, progress printed every 10 s."""

    def __init__(self, url: str, total: int) -> None:
        self.url, self.total = url, total
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[dict[str, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def done(self) -> bool:
        return bool(self.samples) and self.samples[-1]["effects"] >= self.total

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not self._stop.is_set():
                row = dict(await conn.fetchrow(SAMPLE))
                self.samples.append({k: float(v or 0) for k, v in row.items()})
                if len(self.samples) % 10 == 0:
                    first, last = self.samples[0], self.samples[-1]
                    print(
                        f"  {last['effects']:,.0f} of {self.total:,} after "
                        f"{last['at'] - first['at']:.0f} s; dead tuples: messages "
                        f"{last['dead_m']:,.0f}, claims {last['dead_c']:,.0f}",
                        flush=True,
                    )
                await asyncio.sleep(1.0)
        finally:
            await conn.close()


def drain(url: str, env: dict[str, str], work: Path, messages: int, name: str) -> dict[str, Any]:
    """Fill `messages`, start one worker, sample until every effect is written."""
    print(f"{name}: {messages:,} messages", flush=True)
    asyncio.run(prepare(url))
    asyncio.run(restart_effects(url))
    asyncio.run(fill(url, messages, f"{name}-"))
    log = (work / f"worker-{name}.log").open("ab")
    sampler = Sampler(url, messages)
    sampler.start()
    worker = subprocess.Popen(
        [*console_script("webhook-inbox"), "worker"], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    memory = MemorySampler(worker.pid, interval=1.0)
    memory.start()
    started = time.monotonic()
    try:
        while not sampler.done():
            if time.monotonic() - started > 1500:
                raise RuntimeError(f"{name}: not drained in 1,500 s")
            if worker.poll() is not None:
                raise RuntimeError(f"{name}: the worker exited ({worker.returncode})")
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(30)
        peak = memory.stop()
        samples = sampler.stop()
        log.close()
    span = asyncio.run(effects_span(url))
    return {
        "name": name,
        "messages": messages,
        "seconds": span,
        "rate": messages / span,
        "peak_rss_mb": peak / 2**20,
        "samples": samples,
    }


async def restart_effects(url: str) -> None:
    """Effects numbered from 1 again: SAMPLE reads their count as the last id."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE bench_effects RESTART IDENTITY")
    finally:
        await conn.close()


async def effects_span(url: str) -> float:
    """From the first claim's attempt to the last effect, by the database's clock."""
    conn = await asyncpg.connect(url)
    try:
        return float(
            await conn.fetchval(
                "SELECT extract(epoch FROM (SELECT max(at) FROM bench_effects) "
                "- (SELECT min(started_at) FROM inbox_attempts))"
            )
        )
    finally:
        await conn.close()


def windows(samples: list[dict[str, float]]) -> list[tuple[float, float]]:
    """(seconds since the first effect, msgs/s) over consecutive `WINDOW`-second windows."""
    moving = [s for s in samples if s["effects"] > 0]
    if not moving:
        return []
    start, out, i = moving[0]["at"], [], 0
    for j, s in enumerate(moving):
        if s["at"] - moving[i]["at"] >= WINDOW or j == len(moving) - 1:
            if s["at"] > moving[i]["at"]:
                rate = (s["effects"] - moving[i]["effects"]) / (s["at"] - moving[i]["at"])
                out.append((moving[i]["at"] - start, rate))
            i = j
    return out


def longest_below(series: list[tuple[float, float]], floor: float) -> float:
    """The longest run of consecutive windows below `floor`, in seconds (the last window,
    the tail of the drain, left out)."""
    longest = run = 0.0
    for _, rate in series[:-1]:
        run = run + WINDOW if rate < floor else 0.0
        longest = max(longest, run)
    return longest


async def progress(url: str) -> dict[str, float]:
    """The effects so far (their last id) and the messages left, by the database's clock."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT extract(epoch FROM clock_timestamp()) AS at, "
            "(SELECT coalesce(max(id), 0) FROM bench_effects) AS effects, "
            "(SELECT count(*) FROM inbox_messages WHERE status = 'pending') AS left"
        )
        return {k: float(v) for k, v in row.items()}
    finally:
        await conn.close()


def ingest_phase(srv: Server, url: str, work: Path, args: argparse.Namespace, tag: str) -> Any:
    """wrk's closed-loop rate for `args.duration`, then bench/openloop's latency at `args.rate`;
    the worker's drain rate over both, when one runs."""
    wrk = ensure_wrk()
    per_thread = int(MAX_RPS * args.duration / 2)
    prefix, body = write_requests(work / "req", tag, per_thread, 2, b"unused")
    before = asyncio.run(progress(url))
    closed = run_wrk(
        wrk,
        f"{srv.url}/webhooks/bench",
        connections=args.connections,
        threads=2,
        duration=args.duration,
        requests=prefix,
        body_template=body,
        dup_fraction=0.0,
        ack_log=work / "ack",
    )
    opened = openloop(
        f"{srv.url}/webhooks/bench", args.rate, args.duration, f"{tag}-ol", work / "acked.txt"
    )
    after = asyncio.run(progress(url))
    phase = {
        "tag": tag,
        "rps": closed.rps,
        "wrk_p99_ms": closed.p99_ms,
        "wrk_failed": closed.non_2xx + closed.socket_errors,
        "open_p50_ms": opened["latency_ms"]["p50"],
        "open_p99_ms": opened["latency_ms"]["p99"],
        "open_achieved": opened["achieved_rate"],
        "open_failed": opened["non_2xx"] + opened["errors"],
        "drained_per_s": (after["effects"] - before["effects"]) / (after["at"] - before["at"]),
        "left": after["left"],
    }
    print(
        f"  {tag}: wrk {phase['rps']:,.0f} req/s (p99 {phase['wrk_p99_ms']:.0f} ms); open loop "
        f"{args.rate:g}/s p50 {phase['open_p50_ms']} ms, p99 {phase['open_p99_ms']} ms; "
        f"worker {phase['drained_per_s']:,.0f} msgs/s, {phase['left']:,.0f} pending left",
        flush=True,
    )
    return phase


def ingest_main(args: argparse.Namespace) -> None:
    """Ingest idle, then while one worker drains under each of `args.worker_settings` in a
    rotated order, `args.rounds` times in the same run."""
    variants = {name: settings(name) for name in args.worker_settings}
    phases: dict[str, list[dict[str, Any]]] = {"idle": [], **{name: [] for name in variants}}
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-backlog-") as tmp:
        work = Path(tmp)
        url, env = migrated(pg, work, args)
        asyncio.run(prepare(url))
        asyncio.run(restart_effects(url))
        asyncio.run(fill(url, args.ingest_backlog, "ingest-"))
        serve = [*console_script("webhook-inbox"), "serve", "--no-migrate", "--no-worker"]
        with Server("ingest", serve, env, work / "serve.log") as srv:
            ingest_phase(srv, url, work, args, "warm")
            for round_ in range(args.rounds):
                print(f"round {round_ + 1}: idle", flush=True)
                phases["idle"].append(ingest_phase(srv, url, work, args, f"idle{round_}"))
                names = list(variants)
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    print(f"round {round_ + 1}: one worker draining, {name}", flush=True)
                    worker_env = {**env, **variants[name]}
                    phase = draining_phase(srv, url, work, args, worker_env, f"{name}/{round_}")
                    phases[name].append(phase)
        asyncio.run(pg.drop_database(url))
    idle = phases["idle"]
    idle_rps = statistics.median(p["rps"] for p in idle)

    def spread(phases: list[dict[str, Any]], key: str) -> str:
        return ", ".join(f"{p[key]:,.0f}" for p in phases)

    print()
    met = {}
    for name, runs in phases.items():
        print(
            f"{name}: wrk {spread(runs, 'rps')} req/s (p99 {spread(runs, 'wrk_p99_ms')} ms); "
            f"open loop {args.rate:g}/s p99 {spread(runs, 'open_p99_ms')} ms "
            f"(p50 {spread(runs, 'open_p50_ms')}); worker {spread(runs, 'drained_per_s')} msgs/s; "
            f"failed {sum(p['wrk_failed'] + p['open_failed'] for p in runs)}"
        )
        if name == "idle":
            continue
        ratio = statistics.median(p["rps"] for p in runs) / idle_rps
        p99 = statistics.median(p["open_p99_ms"] for p in runs)
        each = ", ".join(f"{d['rps'] / i['rps']:.2f}" for i, d in zip(idle, runs, strict=True))
        met[name] = ratio >= INGEST_RATIO and p99 < INGEST_P99_MS
        print(
            f"  / idle rate: {ratio:.2f} of medians (each round: {each}; target >= "
            f"{INGEST_RATIO}); open-loop p99 {p99:.1f} ms median (target < {INGEST_P99_MS:g}): "
            f"{'met' if met[name] else 'MISSED'}"
        )
    document = {"phases": phases, "met": met}
    finish(all(met.values()), "backlog-ingest", document)


def settings(variant: str) -> dict[str, str]:
    """`INBOX_WORKER_NICE=10,INBOX_WORKER_CONCURRENCY=2` as environment variables."""
    pairs = [item.split("=", 1) for item in variant.split(",") if item]
    if not all(len(pair) == 2 and pair[0].startswith("INBOX_") for pair in pairs):
        raise SystemExit(f"--worker-settings: not INBOX_NAME=value[,...]: {variant}")
    return dict((name, value) for name, value in pairs)


def draining_phase(
    srv: Server, url: str, work: Path, args: argparse.Namespace, env: dict[str, str], tag: str
) -> Any:
    """An ingest phase while one `webhook-inbox worker` with `env` drains the backlog."""
    log = (work / "worker.log").open("ab")
    command = [*console_script("webhook-inbox"), "worker"]
    worker = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log)
    try:
        asyncio.run(wait_for_listeners(url, 1))
        time.sleep(2.0)  # past the worker's first claims: its steady drain
        phase = ingest_phase(srv, url, work, args, tag)
        if phase["left"] == 0:
            raise RuntimeError("the backlog ran out: raise --ingest-backlog")
        return phase
    finally:
        worker.terminate()
        worker.wait(60)
        log.close()


def finish(met: bool, name: str, document: dict[str, Any]) -> None:
    """The verdict and the load average printed, the figures written to bench/results."""
    print(f"targets: {'met' if met else 'MISSED'}")
    print(f"load average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(document, indent=1))
    print(f"results: {out}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    if args.ingest:
        ingest_main(args)
        return
    order = ["small"] * ((args.small_runs + 1) // 2) + ["large"]
    order += ["small"] * (args.small_runs // 2)
    runs: list[dict[str, Any]] = []
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-backlog-") as tmp:
        work = Path(tmp)
        url, env = migrated(pg, work, args)
        for i, kind in enumerate(order):
            size = args.small if kind == "small" else args.large
            run = drain(url, env, work, size, f"{kind}{i}")
            runs.append(run)
            print(
                f"{run['name']}: {run['rate']:,.0f} msgs/s over {run['seconds']:.1f} s, "
                f"worker peak RSS {run['peak_rss_mb']:.0f} MB",
                flush=True,
            )
        asyncio.run(pg.drop_database(url))
    small = [r["rate"] for r in runs if r["messages"] == args.small]
    large = next(r for r in runs if r["messages"] == args.large)
    large_rate = float(large["rate"])
    ratio = large_rate / statistics.median(small)
    series = windows(large["samples"])
    floor = FLOOR * statistics.median(small)
    below = longest_below(series, floor)
    rates = [rate for _, rate in series[:-1]] or [0.0]
    dead_m = max(s["dead_m"] for s in large["samples"])
    dead_c = max(s["dead_c"] for s in large["samples"])
    vacuums = (
        large["samples"][-1]["vacuums_m"] - large["samples"][0]["vacuums_m"],
        large["samples"][-1]["vacuums_c"] - large["samples"][0]["vacuums_c"],
    )
    print()
    print(f"small drains: {', '.join(f'{r:,.0f}' for r in small)} msgs/s")
    print(
        f"large drain: {large['rate']:,.0f} msgs/s; / small median {ratio:.2f} "
        f"(/ each small: {', '.join(f'{large_rate / r:.2f}' for r in small)}; "
        f"target >= {TARGET})"
    )
    print(
        f"large drain over {WINDOW:.0f} s windows: min {min(rates):,.0f}, median "
        f"{statistics.median(rates):,.0f}, max {max(rates):,.0f} msgs/s; longest stretch below "
        f"{FLOOR}x small ({floor:,.0f} msgs/s): {below:.0f} s (target <= {FLOOR_SECONDS:.0f})"
    )
    print(
        f"dead tuples at most: inbox_messages {dead_m:,.0f}, inbox_claims {dead_c:,.0f}; "
        f"autovacuums during the drain: {vacuums[0]:.0f} and {vacuums[1]:.0f}"
    )
    peaks = ", ".join(f"{r['peak_rss_mb']:.0f}" for r in runs)
    print(f"worker peak RSS: {peaks} MB")
    met = ratio >= TARGET and below <= FLOOR_SECONDS
    finish(met, "backlog", {"runs": runs, "windows": series, "ratio": ratio})


if __name__ == "__main__":
    main()
