"""bench/claims: what PostgreSQL spends per message on the worker's statements, with each way of
claiming a batch.

- **locked** (shipped for Python handlers since 0008): the processing transaction locks its due
  rows (`FOR UPDATE SKIP LOCKED`) without changing them, and a second connection commits the
  attempts as claims (`inbox_claims`) before any handler would run; the finish updates each
  message row once and releases the claims.
- **leased** (forwards and the messages that run alone; every batch before 0008): an UPDATE
  marks the rows `processing`, counting the attempts, and commits; a second transaction locks
  them again (the hold) and finishes them. Both UPDATEs write a new version of the wide row and
  an entry in each of its full indexes (`status` is in the partial indexes' predicates, so
  neither can be a HOT update).
- **claim rows** (a variant measured, not built): one connection, as leased, but the claim
  inserts claim rows instead of updating the message rows, and the hold locks the rows whose
  claim is still this attempt's.

Every side writes the same one-row effect and attempt row per message, with the service's own
statements where it has them. Each drains the same backlog on one connection, in turn, for
`--rounds`; the server's CPU is read from /proc around each drain (a local server only;
otherwise the rates alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench.load import BODY_TEMPLATE
from bench.pg import BenchPostgres
from bench.process import INSERT_BACKLOG
from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import upgrade
from service.core.settings import Settings
from service.core.status import Status
from service.store.attempts import FINISH_ATTEMPTS, outcomes_document
from service.store.claims import CLAIM_BEGIN, HOLD_CLAIMED, RECORD_CLAIMS
from service.store.due import CLAIM_DUE, LOCK_DUE
from service.store.results import AttemptResult

RESULTS = Path(__file__).resolve().parent / "results"

SCRATCH = """
CREATE TABLE bench_effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    inbox_id   bigint NOT NULL,
    message_id text   NOT NULL
);
"""
EFFECTS = """
    INSERT INTO bench_effects (inbox_id, message_id)
    SELECT * FROM unnest($1::bigint[], $2::text[])
"""
# The leased batch's hold, in asyncpg's placeholders.
HOLD = HOLD_CLAIMED.text.replace(":ids", "$1").replace(":attempts", "$2")

# The one-connection variant: the claim writes claim rows, not message rows. The message row's
# lock only orders concurrent claimers; the claims' primary key decides which one wins (an
# expired claim is taken over, a live one is not).
CLAIM_ROWS = """
    WITH due AS (
        SELECT m.id, m.attempts
          FROM inbox_messages AS m
          LEFT JOIN inbox_claims AS c ON c.message_id = m.id
         WHERE m.status IN ('pending', 'retrying')
           AND m.next_attempt_at <= now()
           AND m.source = ANY($1::text[])
           AND m.run_alone = false
           AND (c.locked_until IS NULL OR c.locked_until < now())
         ORDER BY m.next_attempt_at, m.id
         LIMIT $2
           FOR UPDATE OF m SKIP LOCKED
    ), claimed AS (
        INSERT INTO inbox_claims AS k (message_id, attempt, actor, locked_until)
        SELECT id, attempts + 1, 'bench', clock_timestamp() + interval '30 seconds' FROM due
            ON CONFLICT (message_id) DO UPDATE
           SET attempt = excluded.attempt, locked_until = excluded.locked_until
         WHERE k.locked_until < now()
        RETURNING message_id
    )
    SELECT m.id, m.source, m.message_id, m.event_type, m.attempts, m.headers, m.body,
           m.content_type, m.trace_context, m.budget_start
      FROM claimed JOIN inbox_messages AS m ON m.id = claimed.message_id
"""
# Its hold: the rows whose claim is still this attempt's.
HOLD_CLAIM_ROWS = """
    SELECT m.id
      FROM inbox_messages AS m
      JOIN unnest($1::bigint[], $2::int[]) AS c(id, attempts) ON m.id = c.id
      JOIN inbox_claims AS k ON k.message_id = m.id AND k.attempt = c.attempts + 1
     WHERE (m.status || '') IN ('pending', 'retrying')
       AND m.attempts = c.attempts
     ORDER BY m.id
       FOR UPDATE OF m
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="backlog size (20000)")
    parser.add_argument("--batch-size", type=int, default=100, help="messages a batch (100)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    return parser.parse_args()


def outcomes(rows: Sequence[asyncpg.Record], counted: bool) -> str:
    """Every row processed, as the worker records it (`outcomes_document`). `counted`: the
    claim already added this attempt to `attempts` (leased: the claim returns the count made
    before it)."""
    now = datetime.now(UTC)
    results = [
        AttemptResult(r["id"], r["attempts"] + 1, Status.PROCESSED, "processed", now, now)
        for r in rows
    ]
    return outcomes_document(results, leased=counted)


async def hold_leased(
    conn: asyncpg.Connection, _: asyncpg.Connection, batch: int
) -> list[asyncpg.Record]:
    """leased: mark the rows `processing` (counting the attempts) and commit, then lock them
    again in the finishing transaction."""
    await conn.execute(CLAIM_BEGIN)
    rows: list[asyncpg.Record] = await conn.fetch(CLAIM_DUE, ["bench"], [30.0], batch)
    await conn.execute("COMMIT")
    if rows:
        await conn.execute("BEGIN")
        await conn.fetch(HOLD, [r["id"] for r in rows], [r["attempts"] + 1 for r in rows])
    return rows


async def hold_locked(
    conn: asyncpg.Connection, other: asyncpg.Connection, batch: int
) -> list[asyncpg.Record]:
    """locked: lock the due rows unchanged, and commit their claims on the other connection."""
    await conn.execute(CLAIM_BEGIN)
    rows: list[asyncpg.Record] = await conn.fetch(LOCK_DUE, ["bench"], batch)
    if not rows:
        await conn.execute("COMMIT")
        return rows
    ids = [r["id"] for r in rows]
    attempts = [r["attempts"] + 1 for r in rows]
    await other.execute(RECORD_CLAIMS, ids, attempts, [30.0] * len(ids), "bench")
    return rows


async def hold_claim_rows(
    conn: asyncpg.Connection, _: asyncpg.Connection, batch: int
) -> list[asyncpg.Record]:
    """claim rows: insert claims and commit, then lock the rows whose claim is still ours."""
    await conn.execute(CLAIM_BEGIN)
    rows: list[asyncpg.Record] = await conn.fetch(CLAIM_ROWS, ["bench"], batch)
    await conn.execute("COMMIT")
    if rows:
        await conn.execute("BEGIN")
        held = await conn.fetch(
            HOLD_CLAIM_ROWS, [r["id"] for r in rows], [r["attempts"] for r in rows]
        )
        assert len(held) == len(rows)
    return rows


@dataclass(frozen=True)
class Side:
    """One way of claiming: `hold` claims a batch and holds it in an open transaction on the
    first connection (no rows: nothing due, nothing open); `leased`, whether the claim made
    the rows `processing` and counted their attempts, as the finish must know."""

    hold: Callable[[asyncpg.Connection, asyncpg.Connection, int], Awaitable[list[asyncpg.Record]]]
    leased: bool


SIDES: dict[str, Side] = {
    "locked": Side(hold_locked, leased=False),
    "leased": Side(hold_leased, leased=True),
    "claim rows": Side(hold_claim_rows, leased=False),
}


async def drain(side: Side, conn: asyncpg.Connection, other: asyncpg.Connection, batch: int) -> int:
    """Claim, hold and finish batches the side's way until none is due; how many messages.
    The finish is every side's: each message's one-row effect and its attempt, processed."""
    finishing = ["processing"] if side.leased else ["pending", "retrying"]
    done = 0
    while rows := await side.hold(conn, other, batch):
        await conn.execute(EFFECTS, [r["id"] for r in rows], [r["message_id"] for r in rows])
        await conn.fetch(FINISH_ATTEMPTS, outcomes(rows, side.leased), finishing, "bench")
        await conn.execute("COMMIT")
        done += len(rows)
    return done


def backend_cpu(pids: Sequence[int]) -> float | None:
    """User+system CPU of these server backends (None: not on this machine)."""
    try:
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)
    except psutil.Error:
        return None


async def fill(conn: asyncpg.Connection, messages: int) -> None:
    await conn.execute("TRUNCATE inbox_messages, bench_effects, inbox_claims")
    await conn.execute(INSERT_BACKLOG, f"c{time.time_ns()}-", BODY_TEMPLATE, messages)
    await conn.execute("VACUUM ANALYZE inbox_messages")
    await conn.execute("VACUUM ANALYZE inbox_attempts")
    await conn.execute("CHECKPOINT")


async def measure(url: str, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    dsn = asyncpg_dsn(url)
    setup, conn, other = [await asyncpg.connect(dsn) for _ in range(3)]
    await setup.execute(SCRATCH)
    pids = [conn.get_server_pid(), other.get_server_pid()]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SIDES}
    try:
        for round_ in range(args.rounds):
            order = list(SIDES)[round_ % len(SIDES) :] + list(SIDES)[: round_ % len(SIDES)]
            for name in order:
                await fill(setup, args.messages)
                cpu_before, started = backend_cpu(pids), time.perf_counter()
                done = await drain(SIDES[name], conn, other, args.batch_size)
                seconds = time.perf_counter() - started
                cpu_after = backend_cpu(pids)
                left = await setup.fetchval(
                    "SELECT count(*) FROM inbox_messages WHERE status <> 'processed'"
                )
                effects = await setup.fetchval("SELECT count(*) FROM bench_effects")
                if done != args.messages or left or effects != done:
                    raise SystemExit(f"{name}: drained {done}, {left} left, {effects} effects")
                run = {"messages": done, "seconds": seconds, "msgs_per_s": done / seconds}
                if cpu_before is not None and cpu_after is not None:
                    run["pg_us_per_message"] = (cpu_after - cpu_before) / done * 1e6
                runs[name].append(run)
                pg = run.get("pg_us_per_message")
                print(
                    f"round {round_ + 1}  {name:16} {run['msgs_per_s']:8.0f} msgs/s"
                    + (f"  PostgreSQL {pg:5.1f} us a message" if pg is not None else ""),
                    flush=True,
                )
    finally:
        for c in (setup, conn, other):
            await c.close()
    return runs


def report(runs: dict[str, list[dict[str, float]]]) -> None:
    print("\nmedians             msgs/s   PostgreSQL us a message")
    medians = {}
    for name, side in runs.items():
        rate = statistics.median(r["msgs_per_s"] for r in side)
        cpu = [r["pg_us_per_message"] for r in side if "pg_us_per_message" in r]
        medians[name] = (rate, statistics.median(cpu) if cpu else None)
        shown = f"{medians[name][1]:8.1f}" if cpu else "       -"
        print(f"{name:18} {rate:8.0f}   {shown}")
    base_rate, base_cpu = medians["leased"]
    for name, (rate, side_cpu) in medians.items():
        if name == "leased":
            continue
        print(f"{name} / leased: {rate / base_rate:.2f}x the rate", end="")
        if base_cpu and side_cpu:
            print(f", {side_cpu / base_cpu:.2f}x PostgreSQL's CPU a message")
        else:
            print()


async def main() -> None:
    args = parse_args()
    with BenchPostgres() as pg:
        url = await pg.create_database("inbox_bench_claims")
        try:
            engine = create_engine(url, Settings(database_url=url))
            await upgrade(engine)
            await engine.dispose()
            runs = await measure(url, args)
            settings = await pg.settings()
        finally:
            await pg.drop_database(url)
    report(runs)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"claims-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document: dict[str, Any] = {"args": vars(args), "postgres": settings, "runs": runs}
    path.write_text(json.dumps(document, indent=2))
    print(f"postgres: {settings}\nload average at end: {os.getloadavg()}\nresults: {path}")


if __name__ == "__main__":
    asyncio.run(main())
