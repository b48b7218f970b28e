"""Baseline for bench/process: pgqueuer draining a backlog in one process, on the same database.

`python -m bench.baselines.pgqueuer_drain URL JOBS MODE [--batch-size N] [--phase P]` enqueues
JOBS jobs (one batch insert), then runs one pgqueuer QueueManager in drain mode and prints one
JSON line: jobs, seconds (from the start of `QueueManager.run` to its return), jobs/s, CPU
seconds. `--phase enqueue` only enqueues, `--phase drain` only drains what is queued: apart,
the database's CPU for the drain alone can be read around the second.

- `noop`: the entrypoint does nothing; what pgqueuer itself costs per job.
- `insert`: the entrypoint inserts one row through a pool connection of its own, committed on
  its own: not atomic with the job's completion, which pgqueuer records later in a buffered
  status log. webhook-inbox's handler commits its row together with the `processed` mark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS pgq_effects (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint      NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
PAYLOAD = b'{"id": "evt_0000000000", "type": "invoice.paid", "data": {"amount": 1200}}'


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def prepare(url: str, jobs: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if not await queries.schema_is_installed():
            await queries.install()
        await conn.execute(EFFECTS_DDL)
        await conn.execute("TRUNCATE pgq_effects")
        await queries.clear_queue(None)
        for start in range(0, jobs, 5000):
            n = min(5000, jobs - start)
            await queries.enqueue(["job"] * n, [PAYLOAD] * n, [0] * n)
    finally:
        await conn.close()


async def drain(url: str, mode: str, batch_size: int) -> dict[str, float]:
    conn = await asyncpg.connect(url)
    pool = await asyncpg.create_pool(url, min_size=4, max_size=4)
    done = 0
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        if mode == "noop":

            @qm.entrypoint("job")
            async def noop(job: Job) -> None:
                nonlocal done
                done += 1

        else:

            @qm.entrypoint("job")
            async def insert(job: Job) -> None:
                nonlocal done
                await pool.execute("INSERT INTO pgq_effects (job_id) VALUES ($1)", job.id)
                done += 1

        cpu = cpu_seconds()
        started = time.perf_counter()
        await qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
        seconds = time.perf_counter() - started
        cpu = cpu_seconds() - cpu
        effects = await pool.fetchval("SELECT count(*) FROM pgq_effects")
        left = await pool.fetchval("SELECT count(*) FROM pgqueuer")
    finally:
        await pool.close()
        if not conn.is_closed():
            await conn.close()
    return {
        "jobs": done,
        "seconds": seconds,
        "rate": done / seconds,
        "cpu_seconds": cpu,
        "effects": effects,
        "left": left,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.pgqueuer_drain")
    parser.add_argument("url")
    parser.add_argument("jobs", type=int)
    parser.add_argument("mode", choices=("noop", "insert"))
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--phase", choices=("all", "enqueue", "drain"), default="all")
    args = parser.parse_args()
    if args.phase != "drain":
        asyncio.run(prepare(args.url, args.jobs))
    if args.phase == "enqueue":
        return
    print(
        json.dumps({"mode": args.mode, **asyncio.run(drain(args.url, args.mode, args.batch_size))})
    )


if __name__ == "__main__":
    main()
