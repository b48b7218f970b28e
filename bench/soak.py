"""bench/soak: one `webhook-inbox serve` under ten minutes of mixed work; errors, throughput, RSS.

Run `bench/soak` (or `bench/soak --quick`, one minute); see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil

from bench.handlers import EFFECTS_DDL
from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres, connected
from bench.servers import Server, process_tree, tree_rss_bytes
from bench.systems import RESULTS_DIR, console_script

ROOT = Path(__file__).resolve().parents[1]

# Ids with `-fail-` always fail (3 attempts, then dead), `-flaky-` fail once. Backoff is short
# so that retries and dead letters happen within the run. [retention] keeps the defaults: the
# soak seeds rows old enough to prune rather than shortening retention below the floor.
SOURCES_TOML = """
[sources.soak]
kind = "generic"
id_header = "X-Message-Id"
handlers = ["bench.handlers:insert_or_fail"]
max_attempts = 3
backoff_base_seconds = 0.2
backoff_max_seconds = 1.0

[retention]
processed_days = 30
dead_days = 30
"""

# Finished rows from "40 days ago", as if the service had been running for months: pruning
# deletes exactly these (the live rows are inside retention and the redelivery floor).
SEED_OLD = """
INSERT INTO inbox_messages (source, message_id, status, attempts, received_at,
                            last_received_at, next_attempt_at, processed_at, body, content_type)
SELECT 'soak', $1 || g, 'processed', 1, now() - interval '40 days', now() - interval '40 days',
       now() - interval '40 days', now() - interval '40 days',
       convert_to(replace($2, '{id}', $1 || g), 'UTF8'), 'application/json'
  FROM generate_series(1, $3) AS g
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/soak",
        description="Mixed work against one `webhook-inbox serve` (its HTTP and processing "
        "processes; RSS and CPU summed over them): ingest "
        "with duplicates, failing handlers, admin queries and bulk retries, pruning. Reports "
        "errors, per-minute throughput and RSS, and checks exactly-once at the end.",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run (10)")
    parser.add_argument("--rate", type=float, default=200.0, help="deliveries/s offered (200)")
    parser.add_argument("--dup", type=float, default=0.3, help="fraction of duplicates (0.3)")
    parser.add_argument("--fail", type=float, default=0.02, help="ids that always fail (0.02)")
    parser.add_argument("--flaky", type=float, default=0.03, help="ids that fail once (0.03)")
    parser.add_argument("--seed-old", type=int, default=2000, help="old rows seeded per prune")
    parser.add_argument("--log-level", default="INFO", help="the service's INBOX_LOG_LEVEL")
    parser.add_argument("--quick", action="store_true", help="one minute")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes = 1.0
    return args


@dataclass
class Admin:
    """What the admin side did, and what went wrong."""

    calls: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    seeded: int = 0
    pruned: int = 0
    retried: int = 0
    per_minute: Counter[int] = field(default_factory=Counter)
    pruned_per_minute: Counter[int] = field(default_factory=Counter)
    # Each call (and each seeding of old rows): when it began (epoch), how long, what.
    spans: list[tuple[float, float, str]] = field(default_factory=list)


async def admin_loop(
    base: str, token: str, url: str, admin: Admin, stop: asyncio.Event, started: float, seed: int
) -> None:
    """List, stats and dead letters every 2 s; metrics every 10 s; a bulk retry of the dead
    every 30 s; every 60 s (from 20 s in) seed old processed rows and prune them over the API."""
    headers = {"authorization": f"Bearer {token}"}
    db = await asyncpg.connect(url)
    tick = 0
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:

        async def call(name: str, method: str, path: str, **kw: Any) -> dict[str, Any] | None:
            admin.calls[name] += 1
            admin.per_minute[int((time.monotonic() - started) // 60)] += 1
            began = time.time()
            try:
                response = await client.request(method, path, **kw)
            except Exception as exc:
                admin.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                return None
            finally:
                admin.spans.append((began, time.time() - began, name))
            if response.status_code // 100 != 2:
                admin.errors.append(f"{name}: HTTP {response.status_code}: {response.text[:200]}")
                return None
            if name == "metrics":
                return {}
            body: dict[str, Any] = response.json()
            return body

        try:
            while not stop.is_set():
                tick += 1
                await call("list", "GET", "/admin/messages", params={"limit": 50})
                await call("stats", "GET", "/admin/stats")
                page = await call(
                    "dead-letters", "GET", "/admin/dead-letters", params={"limit": 50}
                )
                if page and page.get("next_cursor"):
                    params = {"limit": 50, "cursor": page["next_cursor"]}
                    await call("dead-letters page 2", "GET", "/admin/dead-letters", params=params)
                if tick % 5 == 0:
                    await call("metrics", "GET", "/metrics")
                if tick % 15 == 5:
                    body = {"status": ["dead"], "source": "soak"}
                    done = await call("bulk retry", "POST", "/admin/messages/retry", json=body)
                    admin.retried += (done or {}).get("retried", 0)
                if tick % 30 == 10:
                    began = time.time()
                    await db.execute(SEED_OLD, f"old-{tick}-", BODY_TEMPLATE, seed)
                    admin.spans.append((began, time.time() - began, "seed old rows"))
                    admin.seeded += seed
                    done = await call("prune", "POST", "/admin/prune")
                    deleted = (done or {}).get("deleted", 0)
                    admin.pruned += deleted
                    admin.pruned_per_minute[int((time.monotonic() - started) // 60)] += deleted
                    if done is not None and deleted != seed:
                        admin.errors.append(f"prune deleted {deleted}, {seed} were seeded")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2.0)
        finally:
            await db.close()


async def processed_count(url: str) -> dict[str, int]:
    async with connected(url) as conn:
        rows = await conn.fetch(
            "SELECT status, count(*) AS n FROM inbox_messages "
            "WHERE source = 'soak' AND message_id NOT LIKE 'old-%' GROUP BY status"
        )
        return {r["status"]: r["n"] for r in rows}


async def settle(url: str, timeout: float) -> bool:
    """Until nothing is pending, retrying or processing (the dead stay dead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = await processed_count(url)
        if not any(counts.get(s) for s in ("pending", "retrying", "processing")):
            return True
        await asyncio.sleep(0.5)
    return False


async def final_checks(url: str, acked: set[str], two_xx: int) -> dict[str, Any]:
    async with connected(url) as conn:
        stored = {
            r["message_id"]
            for r in await conn.fetch(
                "SELECT message_id FROM inbox_messages WHERE source = 'soak' "
                "AND message_id NOT LIKE 'old-%'"
            )
        }
        row = await conn.fetchrow(
            """
            SELECT
              (SELECT count(*) FROM inbox_messages
                WHERE source = 'soak' AND message_id NOT LIKE 'old-%' AND status = 'processed')
                AS processed,
              (SELECT count(*) FROM bench_effects) AS effects,
              (SELECT count(DISTINCT inbox_id) FROM bench_effects) AS distinct_effects,
              (SELECT count(*) FROM inbox_messages m
                WHERE m.status = 'processed' AND m.message_id NOT LIKE 'old-%'
                  AND NOT EXISTS (SELECT 1 FROM bench_effects e WHERE e.inbox_id = m.id))
                AS processed_without_effect,
              (SELECT count(*) FROM bench_effects e JOIN inbox_messages m ON m.id = e.inbox_id
                WHERE m.status <> 'processed') AS effects_of_unprocessed,
              (SELECT count(*) FROM inbox_messages
                WHERE message_id LIKE '%-fail-%' AND status <> 'dead') AS fail_not_dead,
              -- with the redeliveries of a message being handled, kept aside until the
              -- worker's next poll adds them to its row (inbox_receipts)
              (SELECT coalesce(sum(receive_count), 0) FROM inbox_messages
                WHERE source = 'soak' AND message_id NOT LIKE 'old-%')
              + (SELECT coalesce(sum(received), 0) FROM inbox_receipts
                  WHERE source = 'soak' AND message_id NOT LIKE 'old-%') AS receive_count,
              (SELECT count(*) FROM inbox_messages WHERE message_id LIKE 'old-%') AS old_left
            """
        )
    facts = dict(row)
    facts["acked_ids"] = len(acked)
    facts["acked_missing"] = len(acked - stored)
    facts["two_xx"] = two_xx
    facts["ok"] = (
        facts["acked_missing"] == 0
        and facts["effects"] == facts["processed"] == facts["distinct_effects"]
        and facts["processed_without_effect"] == 0
        and facts["effects_of_unprocessed"] == 0
        and facts["receive_count"] == two_xx
    )
    return facts


def rss_mb(processes: list[psutil.Process]) -> float:
    return round(tree_rss_bytes(processes) / 2**20, 1)


def cpu_percent(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.cpu_percent()
    return round(total, 1)


async def soak(
    args: argparse.Namespace, url: str, env: dict[str, str], work: Path
) -> dict[str, Any]:
    async with connected(url) as conn:
        await conn.execute(EFFECTS_DDL)
    command = [*console_script("webhook-inbox"), "serve", "--no-migrate"]
    seconds = args.minutes * 60
    with Server("service", command, env, work / "serve.log") as srv:
        processes = process_tree(srv.pid)
        rss_boot = rss_mb(processes)
        cpu_percent(processes)  # the first call only starts the measurement
        generator = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.openloop",
            "--url",
            f"{srv.url}/webhooks/soak",
            "--rate",
            str(args.rate),
            "--duration",
            str(seconds),
            "--prefix",
            "soak",
            "--dup",
            str(args.dup),
            "--fail",
            str(args.fail),
            "--flaky",
            str(args.flaky),
            "--acked",
            str(work / "acked.txt"),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        started = time.monotonic()
        stop = asyncio.Event()
        admin = Admin()
        admin_task = asyncio.create_task(
            admin_loop(srv.url, env["INBOX_ADMIN_TOKENS"], url, admin, stop, started, args.seed_old)
        )
        samples: list[dict[str, Any]] = []
        previous: dict[str, int] = {}
        rss_start = None
        # A sample per minute of the run; the first RSS taken 10 s into the load counts as the
        # start (imports, pools and caches are filled by then; the boot figure is shown too).
        next_sample = started + min(60.0, seconds)
        while True:
            await asyncio.sleep(max(0.0, min(next_sample, started + 10) - time.monotonic()))
            if rss_start is None and time.monotonic() >= started + 10:
                rss_start = rss_mb(processes)
                continue
            if time.monotonic() < next_sample:
                continue
            counts = await processed_count(url)
            samples.append(
                {
                    "minute": len(samples) + 1,
                    "processed": counts.get("processed", 0) - previous.get("processed", 0),
                    "dead_total": counts.get("dead", 0),
                    "rss_mb": rss_mb(processes),
                    "cpu_percent": cpu_percent(processes),
                }
            )
            previous = counts
            print(f"  minute {len(samples)}: {samples[-1]}", flush=True)
            if next_sample >= started + seconds - 0.5:
                break
            next_sample = min(next_sample + 60, started + seconds)
        out, _ = await generator.communicate()
        load = json.loads(out.decode().strip().splitlines()[-1])
        stop.set()
        await admin_task
        settled = await settle(url, timeout=120)
        rss_end = rss_mb(processes)
        acked = set((work / "acked.txt").read_text().split())
        checks = await final_checks(url, acked, load["acked"])
        counts = await processed_count(url)
    per_minute = []
    for sample in samples:
        m = sample["minute"] - 1
        seconds_of = [s for s in load["per_second"] if m * 60 <= s["second"] < (m + 1) * 60]
        per_minute.append(
            {
                **sample,
                "sent": sum(s["sent"] for s in seconds_of),
                "acked": sum(s["acked"] for s in seconds_of),
                "failed": sum(s["non_2xx"] + s["errors"] for s in seconds_of),
                "admin_calls": admin.per_minute[m],
                "pruned": admin.pruned_per_minute[m],
                "slowest_ms": max((s["slowest_ms"] or 0 for s in seconds_of), default=0),
            }
        )
    return {
        "load": {k: v for k, v in load.items() if k != "per_second"},
        "admin": {
            "calls": dict(admin.calls),
            "errors": admin.errors,
            "seeded": admin.seeded,
            "pruned": admin.pruned,
            "bulk_retried": admin.retried,
        },
        "per_minute": per_minute,
        "slowest_seconds": slowest_seconds(load, admin.spans),
        "settled": settled,
        "final_counts": counts,
        "checks": checks,
        "rss_mb": {"boot": rss_boot, "start": rss_start, "end": rss_end},
        "peak_rss_mb": round(srv.peak_rss / 2**20, 1),
    }


def slowest_seconds(
    load: dict[str, Any], spans: list[tuple[float, float, str]], count: int = 5
) -> list[dict[str, Any]]:
    """The seconds of the schedule whose slowest delivery took longest, each with the admin
    calls that overlapped its requests (from the second's start to its slowest answer)."""
    seconds = [s for s in load["per_second"] if s["slowest_ms"] is not None]
    seconds.sort(key=lambda s: s["slowest_ms"], reverse=True)
    found = []
    for s in seconds[:count]:
        begin = load["start_epoch"] + s["second"]
        end = begin + 1 + s["slowest_ms"] / 1000
        overlapping = Counter(name for at, took, name in spans if at < end and at + took > begin)
        found.append(
            {"second": s["second"], "slowest_ms": s["slowest_ms"], "admin": dict(overlapping)}
        )
    return found


def render(result: dict[str, Any]) -> str:
    load, admin, checks, rss = result["load"], result["admin"], result["checks"], result["rss_mb"]
    errors = load["non_2xx"] + load["errors"] + len(admin["errors"])
    lines = [
        "minute   sent  acked  failed  processed  dead(total)  admin calls  pruned  RSS MB  CPU %"
        "  slowest ms",
        "------  -----  -----  ------  ---------  -----------  -----------  ------  ------  -----"
        "  ----------",
    ]
    for m in result["per_minute"]:
        lines.append(
            f"{m['minute']:>6}  {m['sent']:>5}  {m['acked']:>5}  {m['failed']:>6}  "
            f"{m['processed']:>9}  {m['dead_total']:>11}  {m['admin_calls']:>11}  "
            f"{m['pruned']:>6}  {m['rss_mb']:>6}  {m['cpu_percent']:>5.0f}  {m['slowest_ms']:>10}"
        )
    start = rss["start"] or rss["boot"]
    growth = 100 * (rss["end"] - start) / start
    lines += [
        "",
        f"ingest: {load['requests']} deliveries offered at {load['target_rate']:g}/s "
        f"(achieved {load['achieved_rate']}/s), {load['acked']} acked, "
        f"{load['non_2xx']} non-2xx, {load['errors']} errors; HTTP p50 "
        f"{load['latency_ms']['p50']} ms, p99 {load['latency_ms']['p99']} ms, p99.9 "
        f"{load['latency_ms']['p99.9']} ms, slowest {load['latency_ms']['p100']} ms",
        "slowest seconds of the schedule, with the admin calls in flight meanwhile: "
        + "; ".join(
            f"{s['second']} s: {s['slowest_ms']} ms {s['admin']}" for s in result["slowest_seconds"]
        ),
        f"admin: {sum(admin['calls'].values())} calls {admin['calls']}, {len(admin['errors'])} "
        f"errors; bulk retries re-queued {admin['bulk_retried']}; pruned {admin['pruned']} of "
        f"{admin['seeded']} seeded old rows",
        f"errors: {errors}"
        + (f" {load['error_samples'][:3]} {admin['errors'][:3]}" if errors else ""),
        f"RSS: boot {rss['boot']} MB, start (10 s into the load) {rss['start']} MB, end "
        f"{rss['end']} MB, peak {result['peak_rss_mb']} MB; growth start->end {growth:+.1f}%",
        f"final: settled={result['settled']} {result['final_counts']}",
        f"exactly-once: {'ok' if checks['ok'] else 'FAIL'} - {checks['acked_ids']} acked ids, "
        f"{checks['acked_missing']} missing; {checks['processed']} processed, "
        f"{checks['effects']} effects ({checks['distinct_effects']} distinct), "
        f"{checks['processed_without_effect']} processed without effect, "
        f"{checks['effects_of_unprocessed']} effects of unprocessed; receive_count sum "
        f"{checks['receive_count']} = 2xx answers {checks['two_xx']}",
        "",
        f"  {'PASS' if errors == 0 else 'FAIL'}  errors == 0",
        f"  {'PASS' if growth < 10 else 'FAIL'}  RSS growth < 10%",
        f"  {'PASS' if checks['ok'] else 'FAIL'}  every acked id stored, effects == processed",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"soak: {args.minutes:g} min at {args.rate:g}/s; load average {os.getloadavg()}")
    started = time.time()
    with BenchPostgres() as pg, tempfile.TemporaryDirectory(prefix="inbox-soak-") as tmp:
        work = Path(tmp)
        url = asyncio.run(pg.create_database("bench_soak"))
        (work / "sources.toml").write_text(SOURCES_TOML)
        env = {
            "DATABASE_URL": url,
            "INBOX_CONFIG": str(work / "sources.toml"),
            "INBOX_DATA_DIR": str(work / "inbox-data"),
            "INBOX_ADMIN_TOKENS": secrets.token_hex(16),
            "INBOX_LOG_LEVEL": args.log_level,
        }
        subprocess.run(
            [*console_script("webhook-inbox"), "migrate"],
            env={**os.environ, **env},
            check=True,
            capture_output=True,
        )
        result = asyncio.run(soak(args, url, env, work))
        asyncio.run(pg.drop_database(url))
    print()
    print(render(result))
    print(f"\nload average at end: {os.getloadavg()}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    result["elapsed_s"] = round(time.time() - started, 1)
    result["options"] = vars(args)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"results: {out}")
    errors = result["load"]["non_2xx"] + result["load"]["errors"] + len(result["admin"]["errors"])
    if errors or not result["checks"]["ok"]:
        sys.exit(2)


if __name__ == "__main__":
    main()
