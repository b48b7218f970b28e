"""bench/process: how fast the worker drains a backlog, and accept-to-processed latency.

Run `bench/process` (or `bench/process --quick`); see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.handlers import EFFECTS_DDL
from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres, add_recycled_wal_argument, connected, recycled_wal
from bench.profile import analyse, find_py_spy
from bench.servers import MemorySampler, Server, process_tree, tree_cpu_seconds
from bench.systems import RESULTS_DIR, console_script
from service.store import notifications

ROOT = Path(__file__).resolve().parents[1]

SOURCES_TOML = """
# bench/process: a generic source whose one handler inserts a row per message.
[sources.bench]
kind = "generic"
id_header = "X-Message-Id"
handlers = ["bench.handlers:{handler}"]
"""

# The handler styles a drain can run. Each of the first four writes one bench_effects row per
# message: `execute`: `await ctx.session.execute(INSERT ...)`, a statement and a round trip
# each; `add`: `ctx.session.add(BenchEffect(...))` on a SQLModel table, flushed once per batch
# as one multi-row INSERT; `mapped`: the same with a plain SQLAlchemy mapped class; `insert`:
# `ctx.insert(table, {...})`, no model, one COPY per batch. `noop` writes nothing: the
# control, whose CPU per message is the worker's own.
HANDLERS = {
    "execute": "insert_row",
    "add": "add_row",
    "mapped": "add_mapped_row",
    "insert": "insert_staged_row",
    "noop": "nothing",
}
CONTROL = "noop"

# 20,000 pending messages in one statement, the way ingest would have stored them (a JSON body
# of the usual size, its headers), then one NOTIFY as ingest sends per batch.
INSERT_BACKLOG = """
INSERT INTO inbox_messages (source, message_id, event_type, headers, body, content_type)
SELECT 'bench', $1 || g, 'invoice.paid',
       '{"content-type": "application/json"}'::jsonb,
       convert_to(replace($2, '{id}', $1 || g), 'UTF8'), 'application/json'
  FROM generate_series(1, $3) AS g
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/process",
        description="Drain a backlog with one and with two `webhook-inbox worker` processes, "
        "then measure accept-to-processed latency under an open-loop load on "
        "`webhook-inbox serve`, on PostgreSQL (DATABASE_URL, else embedded).",
    )
    parser.add_argument("--messages", type=int, default=20_000, help="backlog size (20000)")
    parser.add_argument("--workers", default="1,2", help="worker process counts to run (1,2)")
    parser.add_argument(
        "--handlers",
        default="execute,add,mapped,insert,noop",
        help="handler styles the drains run, each in every round: execute (one INSERT "
        "statement per message), add (ctx.session.add of a SQLModel row, one flush per "
        "batch), mapped (the same with a plain SQLAlchemy mapped class), insert (ctx.insert, "
        "one COPY per batch) and noop (no effect: the worker's own cost) "
        "(execute,add,mapped,insert,noop); the latency runs use the first, which must write "
        "an effect",
    )
    parser.add_argument(
        "--rates",
        default="1000,1500,2000,2500",
        help="offered deliveries/s, one latency run (fresh `serve`) each (1000,1500,2000,2500)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="drain rounds; in each, every worker count and the pgqueuer baselines take turns "
        "in a rotated order (3); the medians are compared",
    )
    parser.add_argument(
        "--no-pgqueuer", action="store_true", help="skip the pgqueuer baselines in the drains"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (60)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load first (3)")
    parser.add_argument("--log-level", default="INFO", help="the service's INBOX_LOG_LEVEL")
    parser.add_argument(
        "--skip-latency", action="store_true", help="only the drain runs, no latency run"
    )
    add_recycled_wal_argument(parser, "runs")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 5,000 messages, 5 s of load"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record the first worker under py-spy (PY_SPY or on PATH) during each drain and "
        "print where its time goes",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.duration, args.warmup, args.rounds = 5_000, 5.0, 1.0, 1
    args.workers = [int(w) for w in args.workers.split(",") if w]
    args.handlers = [h for h in args.handlers.split(",") if h]
    unknown = set(args.handlers) - set(HANDLERS)
    if unknown or not args.handlers:
        parser.error(f"--handlers: choose among {', '.join(HANDLERS)}")
    if args.handlers[0] == CONTROL and not args.skip_latency:
        parser.error(
            f"--handlers: the latency runs time the first style's effect rows, and {CONTROL} "
            "writes none: put a style with an effect first, or add --skip-latency"
        )
    args.rates = [float(r) for r in args.rates.split(",") if r]
    return args


def add_effect_arguments(parser: argparse.ArgumentParser, *, log_level: str) -> None:
    """`--handler` and `--log-level`: of a benchmark whose handler writes one row a message."""
    parser.add_argument(
        "--handler",
        default="execute",
        choices=[h for h in HANDLERS if h != CONTROL],
        help="the one-row effect's style, as bench/process --handlers (execute)",
    )
    parser.add_argument("--log-level", default=log_level, help="the service's INBOX_LOG_LEVEL")


def service_env(url: str, work: Path, log_level: str, handler: str) -> dict[str, str]:
    config = work / f"sources-{handler}.toml"
    config.write_text(SOURCES_TOML.format(handler=HANDLERS[handler]))
    return {
        "DATABASE_URL": url,
        "INBOX_CONFIG": str(config),
        "INBOX_DATA_DIR": str(work / "inbox-data"),
        "INBOX_ADMIN_TOKENS": secrets.token_hex(16),
        "INBOX_LOG_LEVEL": log_level,
    }


async def prepare(url: str) -> None:
    async with connected(url) as conn:
        await conn.execute(EFFECTS_DDL)
        await conn.execute("TRUNCATE inbox_messages, bench_effects CASCADE")


async def wait_for_listeners(url: str, count: int, timeout: float = 60.0) -> None:
    """Until `count` workers LISTEN: each claim loop has looked once, and NOTIFY reaches them."""
    async with connected(url) as conn:
        async with asyncio.timeout(timeout):
            await notifications.wait_for_listeners(conn, count)


async def insert_backlog(url: str, messages: int, prefix: str) -> float:
    """Insert and commit the backlog, NOTIFY; the database clock at commit (epoch seconds)."""
    async with connected(url) as conn:
        async with conn.transaction():
            await conn.execute(INSERT_BACKLOG, prefix, BODY_TEMPLATE, messages)
            await conn.execute("NOTIFY webhook_inbox")
        committed = float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))
        return committed


async def wait_drained(url: str, timeout: float) -> bool:
    async with connected(url) as conn:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Two EXISTS, each answered from the first entry of a partial index, not a count
            # of the backlog: that took PostgreSQL 10-20 ms every 50 ms, beside the drain.
            left = await conn.fetchval(
                "SELECT EXISTS (SELECT FROM inbox_messages WHERE status IN ('pending', 'retrying'))"
                " OR EXISTS (SELECT FROM inbox_messages WHERE status = 'processing')"
            )
            if not left:
                return True
            await asyncio.sleep(0.05)
        return False


async def verify(url: str, expected: int, handler: str) -> dict[str, Any]:
    """Each message processed on its first attempt, and exactly one effect row per message
    (none for the control)."""
    async with connected(url) as conn:
        row = await conn.fetchrow(
            """
            SELECT (SELECT count(*) FROM inbox_messages) AS messages,
                   (SELECT count(*) FROM inbox_messages WHERE status = 'processed') AS processed,
                   (SELECT count(*) FROM bench_effects) AS effects,
                   (SELECT count(DISTINCT inbox_id) FROM bench_effects) AS distinct_effects,
                   (SELECT count(*) FROM inbox_messages m
                     WHERE NOT EXISTS (SELECT 1 FROM bench_effects e WHERE e.inbox_id = m.id))
                       AS without_effect,
                   (SELECT count(*) FROM inbox_attempts) AS attempts
            """
        )
        facts = dict(row)
        effects = 0 if handler == CONTROL else expected
        facts["exactly_once"] = (
            facts["messages"] == expected
            and facts["processed"] == expected
            and facts["attempts"] == expected
            and facts["effects"] == effects
            and facts["distinct_effects"] == effects
            and facts["without_effect"] == expected - effects
        )
        return facts


async def drain_span(url: str, committed: float) -> dict[str, float]:
    """From the backlog's commit to the last processed mark, by the database's clock."""
    async with connected(url) as conn:
        row = await conn.fetchrow(
            "SELECT extract(epoch FROM max(processed_at)) AS last, "
            "extract(epoch FROM min(a.started_at)) AS first "
            "FROM inbox_messages m JOIN inbox_attempts a ON a.message_id = m.id"
        )
        return {"last": float(row["last"]), "first_claim": float(row["first"])}


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    record = ["record", "--pid", str(pid), "--function", "--nonblocking", "--rate", "200"]
    spy = subprocess.Popen(
        [find_py_spy(), *record, "--format", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # let py-spy attach before the backlog arrives
    return spy


@dataclass
class DrainRun:
    workers: int
    handler: str  # a key of HANDLERS
    messages: int
    seconds: float
    rate: float
    first_claim_ms: float
    peak_rss_mb: list[float]
    cpu_seconds: list[float]
    pg_cpu_seconds: float | None
    verified: dict[str, Any]


def run_drain(
    pg: BenchPostgres,
    url: str,
    env: dict[str, str],
    work: Path,
    workers: int,
    messages: int,
    handler: str,
    profile: bool = False,
) -> DrainRun:
    asyncio.run(prepare(url))
    command = [*console_script("webhook-inbox"), "worker"]
    log = (work / f"worker-{workers}-{handler}.log").open("ab")
    procs = [
        subprocess.Popen(command, env={**os.environ, **env}, cwd=ROOT, stdout=log, stderr=log)
        for _ in range(workers)
    ]
    samplers = [MemorySampler(p.pid) for p in procs]
    try:
        asyncio.run(wait_for_listeners(url, workers))
        for sampler in samplers:
            sampler.start()
        profile_out = work / f"profile-{workers}-{handler}.txt"
        spy = start_py_spy(procs[0].pid, profile_out) if profile else None
        cpu_before = [sum(s.process.cpu_times()[:2]) for s in samplers]
        committed = asyncio.run(insert_backlog(url, messages, f"drain{workers}-"))
        # After the backlog's insert: the drain's own share (the first claim comes about 10 ms
        # after the commit; reading the server's processes takes about one).
        pg_before = pg.cpu_seconds()
        drained = asyncio.run(wait_drained(url, timeout=600))
        cpu = [
            sum(s.process.cpu_times()[:2]) - b for s, b in zip(samplers, cpu_before, strict=True)
        ]
        pg_after = pg.cpu_seconds()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
            print(analyse(profile_out), flush=True)
        if not drained:
            raise RuntimeError(f"{workers} worker(s) did not drain the backlog in 600 s")
        span = asyncio.run(drain_span(url, committed))
        verified = asyncio.run(verify(url, messages, handler))
    finally:
        peaks = [s.stop() for s in samplers]
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
    seconds = span["last"] - committed
    return DrainRun(
        workers=workers,
        handler=handler,
        messages=messages,
        seconds=seconds,
        rate=messages / seconds,
        first_claim_ms=(span["first_claim"] - committed) * 1000,
        peak_rss_mb=[p / 2**20 for p in peaks],
        cpu_seconds=cpu,
        pg_cpu_seconds=None if pg_before is None or pg_after is None else pg_after - pg_before,
        verified=verified,
    )


PGQUEUER_MODES = ("noop", "insert")


def run_pgqueuer(pg: BenchPostgres, url: str, messages: int, mode: str) -> dict[str, Any]:
    """pgqueuer 1.x draining `messages` jobs in one process (bench/baselines/pgqueuer_drain.py):
    `noop` entrypoint, or `insert` (one row, committed apart from the job's completion).
    The jobs are enqueued by a run of their own, so the database's CPU is the drain's alone."""
    command = [sys.executable, "-m", "bench.baselines.pgqueuer_drain", url, str(messages), mode]
    options: dict[str, Any] = {
        "cwd": ROOT,
        "check": True,
        "capture_output": True,
        "text": True,
        "timeout": 900,
    }
    subprocess.run([*command, "--phase", "enqueue"], **options)
    pg_before = pg.cpu_seconds()
    done = subprocess.run([*command, "--phase", "drain"], **options)
    time.sleep(0.2)  # let the postmaster reap the drain's backends: none is read mid-exit
    pg_after = pg.cpu_seconds()
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["pg_cpu_seconds"] = (
        None if pg_before is None or pg_after is None else pg_after - pg_before
    )
    result["ok"] = result["jobs"] == messages and result["left"] == 0
    if mode == "insert":
        result["ok"] = result["ok"] and result["effects"] == messages
    return result


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def one_worker_runs(drains: list[DrainRun]) -> dict[str, list[DrainRun]]:
    """The one-worker drains, by handler style, in HANDLERS order (styles not run left out)."""
    runs = {h: [d for d in drains if d.workers == 1 and d.handler == h] for h in HANDLERS}
    return {handler: found for handler, found in runs.items() if found}


def one_worker_rates(drains: list[DrainRun]) -> dict[str, list[float]]:
    """msgs/s of the one-worker drains, by handler style, in HANDLERS order."""
    return {h: [d.rate for d in runs] for h, runs in one_worker_runs(drains).items()}


def render_comparison(drains: list[DrainRun], pgq: dict[str, list[dict[str, Any]]]) -> str:
    """Medians over the rounds: one worker process against pgqueuer, run in the same rounds."""
    runs_of = one_worker_runs(drains)
    ones = one_worker_rates(drains)
    if not ones or not any(pgq.values()):
        return ""
    lines = [
        "",
        "drain medians over rounds  runs  msgs/s (each run)                 CPU s   RSS MB",
        "-------------------------  ----  --------------------------------  ------  ------",
    ]
    for handler, one in ones.items():
        runs = runs_of[handler]
        lines.append(
            f"{'webhook-inbox, 1, ' + handler:<25}  {len(one):>4}  {median(one):>6.0f} "
            f"({', '.join(f'{r:.0f}' for r in one)})".ljust(74)
            + f"  {median([d.cpu_seconds[0] for d in runs]):>6.1f}"
            f"  {max(d.peak_rss_mb[0] for d in runs):>6.0f}"
        )
    for mode, results in pgq.items():
        if not results:
            continue
        rates = [r["rate"] for r in results]
        lines.append(
            f"{'pgqueuer, ' + mode:<25}  {len(rates):>4}  {median(rates):>6.0f} "
            f"({', '.join(f'{r:.0f}' for r in rates)})".ljust(74)
            + f"  {median([r['cpu_seconds'] for r in results]):>6.1f}"
            f"  {max(r['peak_rss_mb'] for r in results):>6.0f}"
            + ("" if all(r["ok"] for r in results) else "  INCOMPLETE")
        )
    for handler, one in ones.items():
        for mode, results in pgq.items():
            if results:
                ratio = median(one) / median([r["rate"] for r in results])
                lines.append(f"webhook-inbox {handler} handler / pgqueuer {mode}: {ratio:.2f}x")
    lines.append(
        "handlers: execute = ctx.session.execute(INSERT) per message; add = ctx.session.add(row), "
        "flushed once per batch; mapped = add with a plain SQLAlchemy class, not SQLModel; "
        "insert = ctx.insert(table, values), one COPY per batch; noop = no effect (the "
        "worker's own cost)"
    )
    lines += cpu_per_message(runs_of, pgq)
    return "\n".join(lines)


def cpu_per_message(
    runs_of: dict[str, list[DrainRun]], pgq: dict[str, list[dict[str, Any]]]
) -> list[str]:
    """The one-worker drains' CPU per message, medians over rounds, and what the effect styles
    cost beyond the control: the worker's own share set apart from the handler's row."""
    per = {
        handler: median([d.cpu_seconds[0] / d.messages * 1e6 for d in runs])
        for handler, runs in runs_of.items()
    }
    shown = [f"{handler} {us:.0f}" for handler, us in per.items()]
    shown += [
        f"pgqueuer {mode} {median([r['cpu_seconds'] / r['jobs'] * 1e6 for r in results]):.0f}"
        for mode, results in pgq.items()
        if results
    ]
    lines = [f"CPU us per message, one process: {', '.join(shown)}"]
    if CONTROL in per:
        beyond = [f"{h} {us - per[CONTROL]:.0f}" for h, us in per.items() if h != CONTROL]
        if beyond:
            lines.append(f"  of which the handler's effect (beyond {CONTROL}): {', '.join(beyond)}")
    server = []
    for handler, runs in runs_of.items():
        us = [d.pg_cpu_seconds / d.messages * 1e6 for d in runs if d.pg_cpu_seconds is not None]
        if us and len(us) == len(runs):
            server.append(f"{handler} {median(us):.0f}")
    for mode, results in pgq.items():
        us = [
            r["pg_cpu_seconds"] / r["jobs"] * 1e6
            for r in results
            if r.get("pg_cpu_seconds") is not None
        ]
        if us and len(us) == len(results):
            server.append(f"pgqueuer {mode} {median(us):.0f}")
    if server:
        lines.append(f"PostgreSQL CPU us per message (embedded server only): {', '.join(server)}")
    return lines


async def latency_facts(url: str, prefix: str) -> dict[str, Any]:
    async with connected(url) as conn:
        row = await conn.fetchrow(
            """
            SELECT count(*) AS n,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY e.at - m.received_at) AS e50,
                   percentile_cont(0.9) WITHIN GROUP (ORDER BY e.at - m.received_at) AS e90,
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY e.at - m.received_at) AS e99,
                   max(e.at - m.received_at) AS emax,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY m.processed_at - m.received_at)
                       AS p50,
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY m.processed_at - m.received_at)
                       AS p99
              FROM inbox_messages m JOIN bench_effects e ON e.inbox_id = m.id
             WHERE m.message_id LIKE $1 || '%'
            """,
            prefix,
        )
        return {
            "n": row["n"],
            **{
                k: round(row[k].total_seconds() * 1000, 1) if row[k] is not None else None
                for k in ("e50", "e90", "e99", "emax", "p50", "p99")
            },
        }


def openloop(url: str, rate: float, duration: float, prefix: str, acked: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "bench.openloop",
        "--url",
        url,
        "--rate",
        str(rate),
        "--duration",
        str(duration),
        "--prefix",
        prefix,
        "--acked",
        str(acked),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# A backlog is bounded when its oldest unfinished message never gets older than this.
BOUNDED_AGE_SECONDS = 5.0

BACKLOG = """
SELECT count(*) AS n,
       coalesce(extract(epoch FROM clock_timestamp() - min(received_at)), 0) AS oldest
  FROM inbox_messages
 WHERE status IN ('pending', 'retrying', 'processing')
"""


class BacklogSampler:
    """The backlog and its oldest message's age, read from the database once a second."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with connected(self.url) as conn:
            started = time.monotonic()
            while not self._stop.is_set():
                row = await conn.fetchrow(BACKLOG)
                self.samples.append(
                    {
                        "t": round(time.monotonic() - started, 1),
                        "backlog": row["n"],
                        "oldest_s": round(float(row["oldest"]), 3),
                    }
                )
                await asyncio.sleep(1.0)

    def __enter__(self) -> BacklogSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_latency(
    url: str, env: dict[str, str], work: Path, args: argparse.Namespace, rate: float
) -> dict[str, Any]:
    """The default `serve` (supervisor, one HTTP and one processing process) under an
    open-loop `rate` for `args.duration` seconds, the backlog sampled every second."""
    asyncio.run(prepare(url))
    command = [*console_script("webhook-inbox"), "serve", "--no-migrate"]
    with Server("service", command, env, work / "serve.log") as srv:
        asyncio.run(wait_for_listeners(url, 1))
        if args.warmup > 0:
            openloop(f"{srv.url}/webhooks/bench", rate, args.warmup, "warm", work / "w.txt")
            asyncio.run(wait_drained(url, timeout=120))
        load_before = os.getloadavg()[0]
        tree = process_tree(srv.pid)
        cpu_before = tree_cpu_seconds(tree)
        with BacklogSampler(url) as backlog:
            load = openloop(f"{srv.url}/webhooks/bench", rate, args.duration, "lat", work / "a.txt")
        drained = asyncio.run(wait_drained(url, timeout=120))
        cpu = tree_cpu_seconds(tree) - cpu_before
        facts = asyncio.run(latency_facts(url, "lat"))
        rss_mb = {}
        for process in tree:
            with contextlib.suppress(psutil.Error):
                name = "supervisor" if process.pid == srv.pid else " ".join(process.cmdline()[-2:])
                rss_mb[name] = round(process.memory_info().rss / 2**20, 1)
    acked = set((work / "a.txt").read_text().split())
    stored = asyncio.run(stored_ids(url, "lat"))
    load.pop("per_second")
    oldest = max((sample["oldest_s"] for sample in backlog.samples), default=0.0)
    return {
        "load": load,
        "db_latency_ms": facts,
        "drained": drained,
        "acked_missing": len(acked - stored),
        "backlog_per_second": backlog.samples,
        "max_oldest_pending_s": oldest,
        # Bounded only if ingest kept up too: a run whose requests failed or timed out has a
        # small backlog because deliveries never got in.
        "bounded": oldest <= BOUNDED_AGE_SECONDS
        and drained
        and load["non_2xx"] == 0
        and load["errors"] == 0,
        "service_cpu_seconds": round(cpu, 1),
        "service_rss_mb": rss_mb,
        "service_peak_rss_mb": max(rss_mb.values(), default=0.0),
        "loadavg_before": load_before,
    }


async def stored_ids(url: str, prefix: str) -> set[str]:
    async with connected(url) as conn:
        rows = await conn.fetch(
            "SELECT message_id FROM inbox_messages WHERE message_id LIKE $1 || '%'", prefix
        )
        return {r["message_id"] for r in rows}


def render(drains: list[DrainRun], latencies: list[dict[str, Any]]) -> str:
    lines = [
        "drain   handler  messages  seconds   msgs/s  first claim  worker CPU s  postgres CPU s  "
        "peak RSS MB  exactly-once",
        "------  -------  --------  -------  -------  -----------  ------------  --------------  "
        "-----------  ------------",
    ]
    for d in drains:
        lines.append(
            f"{d.workers} proc{'s' if d.workers > 1 else ' '}  {d.handler:<7}"
            f"{d.messages:>9}  {d.seconds:>7.2f}"
            f"  {d.rate:>7.0f}  {d.first_claim_ms:>8.0f} ms"
            f"  {'+'.join(f'{c:.1f}' for c in d.cpu_seconds):>12}"
            f"  {'-' if d.pg_cpu_seconds is None else f'{d.pg_cpu_seconds:.1f}':>14}"
            f"  {'/'.join(f'{r:.0f}' for r in d.peak_rss_mb):>11}"
            f"  {'ok' if d.verified['exactly_once'] else 'FAIL ' + str(d.verified)}"
        )
    if latencies:
        lines += [
            "",
            "offered/s  achieved/s  acked   non-2xx  errors  HTTP p50/p99 ms   "
            "accept-to-effect p50/p90/p99 ms  processed_at p50/p99 ms  oldest pending max s  "
            "serve CPU s  RSS MB",
            "---------  ----------  ------  -------  ------  ---------------   "
            "-------------------------------  -----------------------  --------------------  "
            "-----------  ------",
        ]
    for latency in latencies:
        load, db = latency["load"], latency["db_latency_ms"]
        lines.append(
            f"{load['target_rate']:>9.0f}  {load['achieved_rate']:>10.1f}  "
            f"{load['acked']:>6}  {load['non_2xx']:>7}  {load['errors']:>6}  "
            f"{load['latency_ms']['p50']:>7}/{load['latency_ms']['p99']:<8}  "
            f"{db['e50']:>9}/{db['e90']}/{db['e99']:<12}  "
            f"{db['p50']:>12}/{db['p99']:<10}  "
            f"{latency['max_oldest_pending_s']:>8.1f} "
            f"{'(bounded)' if latency['bounded'] else '(GROWING)':>11}  "
            f"{latency['service_cpu_seconds']:>11}  {latency['service_peak_rss_mb']:>6}"
        )
    if latencies:
        lines += [
            "",
            "accept-to-effect: the handler's row's clock_timestamp() - received_at, from the "
            "database; HTTP latency counts from when each request was due (open loop).",
            f"bounded: the oldest unfinished message never older than "
            f"{BOUNDED_AGE_SECONDS:g} s (sampled each second), the backlog drained after, and "
            "every request answered 2xx (no errors or timeouts).",
            "serve: the supervisor, one HTTP and one processing process; CPU and RSS over all.",
            "every acked id stored: "
            + ", ".join(
                f"{x['load']['target_rate']:g}/s "
                + ("ok" if x["acked_missing"] == 0 else f"{x['acked_missing']} MISSING")
                for x in latencies
            ),
        ]
    return "\n".join(lines)


def targets(
    drains: list[DrainRun],
    latencies: list[dict[str, Any]],
    pgq: dict[str, list[dict[str, Any]]] | None = None,
) -> str:
    lines = ["", "targets:"]

    def line(ok: bool, what: str, measured: str) -> None:
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {what:<52} {measured}")

    for handler, one in one_worker_rates(drains).items():
        if handler == CONTROL:
            continue  # a one-row effect is what the targets ask for; the control writes none
        line(
            median(one) >= 3000,
            f">= 3000 msgs/s with one worker process, {handler}",
            f"{median(one):.0f}",
        )
        for mode, factor in (("noop", 1.0), ("insert", 2.0)):
            runs = (pgq or {}).get(mode, [])
            if runs:
                base = median([r["rate"] for r in runs])
                line(
                    median(one) >= factor * base,
                    f"1 worker, {handler} >= {factor:g}x pgqueuer {mode} (same run)",
                    f"{median(one):.0f} vs {base:.0f} = {median(one) / base:.2f}x",
                )
    at_1000 = [x for x in latencies if x["load"]["target_rate"] == 1000]
    for latency in at_1000:
        load, db = latency["load"], latency["db_latency_ms"]
        p99 = load["latency_ms"]["p99"]
        line(p99 is not None and p99 < 100, "HTTP p99 < 100 ms at 1000/s", f"{p99} ms")
        e50, e99 = db["e50"], db["e99"]
        line(e50 is not None and e50 < 50, "accept-to-processed p50 < 50 ms at 1000/s", f"{e50} ms")
        line(
            e99 is not None and e99 < 500, "accept-to-processed p99 < 500 ms at 1000/s", f"{e99} ms"
        )
        line(
            latency["bounded"],
            "backlog bounded at 1000/s for the whole run",
            f"oldest {latency['max_oldest_pending_s']:.1f} s",
        )
        bad = load["non_2xx"] + load["errors"]
        line(bad == 0, "no non-2xx answer at 1000/s", f"{bad}")
    bounded = [
        x["load"]["target_rate"] for x in latencies if x["bounded"] and not x["load"]["non_2xx"]
    ]
    if latencies:
        best = max(bounded, default=0.0)
        line(best >= 2500, "highest offered rate with a bounded backlog >= 2500/s", f"{best:.0f}/s")

        # Issue 13: the latencies count as well as the bound, at one rate that meets all three.
        def fast(x: dict[str, Any]) -> bool:
            p99, e99 = x["load"]["latency_ms"]["p99"], x["db_latency_ms"]["e99"]
            return p99 is not None and p99 < 100 and e99 is not None and e99 < 1000

        met = [x for x in latencies if x["load"]["target_rate"] in bounded and fast(x)]
        top = max(met, key=lambda x: x["load"]["target_rate"], default=None)
        rate = 0.0 if top is None else top["load"]["target_rate"]
        measured = f"{rate:.0f}/s" + (
            ""
            if top is None
            else f" (HTTP p99 {top['load']['latency_ms']['p99']} ms, "
            f"accept-to-processed p99 {top['db_latency_ms']['e99']} ms)"
        )
        line(
            rate >= 2500,
            "a bounded rate >= 2500/s with HTTP p99 < 100 ms and accept-to-processed p99 < 1 s",
            measured,
        )
    rss = [r for d in drains for r in d.peak_rss_mb]
    rss += [x["service_peak_rss_mb"] for x in latencies]
    if rss:
        line(max(rss) < 200, "RSS < 200 MB per process", f"peak {max(rss):.0f} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    started = time.time()
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-bench-") as tmp:
        work = Path(tmp)
        settings = asyncio.run(pg.settings())
        if args.recycled_wal:
            settings["recycled_wal_segments"] = str(recycled_wal(pg))
        url = asyncio.run(pg.create_database("bench_process"))
        envs = {h: service_env(url, work, args.log_level, h) for h in args.handlers}
        env = envs[args.handlers[0]]
        subprocess.run(
            [*console_script("webhook-inbox"), "migrate"],
            env={**os.environ, **env},
            check=True,
            capture_output=True,
        )
        drains: list[DrainRun] = []
        pgq: dict[str, list[dict[str, Any]]] = {mode: [] for mode in PGQUEUER_MODES}
        turns: list[tuple[int, str] | str] = [
            *((w, h) for w in args.workers for h in args.handlers),
            *([] if args.no_pgqueuer else PGQUEUER_MODES),
        ]
        # No turns (`--workers ''` with `--no-pgqueuer`): no drains, only the latency runs.
        for round_ in range(args.rounds if turns else 0):
            shift = round_ % len(turns)
            for turn in turns[shift:] + turns[:shift]:
                if isinstance(turn, str):
                    print(f"round {round_ + 1}: pgqueuer {turn}, {args.messages} jobs", flush=True)
                    pgq[turn].append(run_pgqueuer(pg, url, args.messages, turn))
                    print(f"  {pgq[turn][-1]['rate']:.0f} jobs/s", flush=True)
                    continue
                workers, handler = turn
                print(
                    f"round {round_ + 1}: draining {args.messages} messages with {workers} "
                    f"worker process(es), {handler} handler",
                    flush=True,
                )
                drains.append(
                    run_drain(
                        pg, url, envs[handler], work, workers, args.messages, handler, args.profile
                    )
                )
                print(f"  {drains[-1].rate:.0f} msgs/s", flush=True)
        latencies = []
        for rate in [] if args.skip_latency else args.rates:
            print(f"latency: {rate:g}/s for {args.duration:g} s", flush=True)
            latencies.append(run_latency(url, env, work, args, rate))
        asyncio.run(pg.drop_database(url))
    print()
    print(render(drains, latencies))
    print(render_comparison(drains, pgq))
    print(targets(drains, latencies, pgq))
    print(f"\nload average at end: {os.getloadavg()}; postgres: {settings}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"process-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "elapsed_s": round(time.time() - started, 1),
                "postgres": settings,
                "drains": [vars(d) for d in drains],
                "pgqueuer": pgq,
                "latency": latencies,
                "loadavg_end": os.getloadavg(),
            },
            indent=2,
            default=str,
        )
    )
    print(f"results: {out}")
    if (
        not all(d.verified["exactly_once"] for d in drains)
        or any(x["acked_missing"] for x in latencies)
        or not all(r["ok"] for results in pgq.values() for r in results)
    ):
        sys.exit(2)


if __name__ == "__main__":
    main()
