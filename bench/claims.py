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

- **keyed** (issue 63): the latency of the claim of keyed messages (`LOCK_KEYED`, and
  `CLAIM_KEYED` for leases) from `--keys` keys x `--depth` messages, each claim in its own
  transaction and its rows then finished, in two regimes: the statistics of an empty table
  (ANALYZE before the fill, as after an outage) and fresh ones (ANALYZE after). Target: p99 at
  most 10 ms, whatever the statistics.
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
from bench.ordering import INSERT as INSERT_KEYED
from bench.ordering import STATISTICS
from bench.pg import BenchPostgres, migrate
from bench.process import INSERT_BACKLOG
from service.core.db import asyncpg_dsn
from service.core.status import Status
from service.store.attempts import FINISH_ATTEMPTS, outcomes_document
from service.store.claims import CLAIM_BEGIN, HOLD_CLAIMED, RECORD_CLAIMS
from service.store.due import CLAIM_DUE, CLAIM_KEYED, LOCK_DUE, LOCK_KEYED
from service.store.results import AttemptResult

RESULTS = Path(__file__).resolve().parent / "results"
KEYED_P99_TARGET_MS = 10.0

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
    parser.add_argument(
        "--part",
        choices=("all", "drains", "keyed"),
        default="all",
        help="the drains by way of claiming, the keyed claims' latency, or both (all)",
    )
    parser.add_argument("--keys", type=int, default=200, help="keyed: ordering keys (200)")
    parser.add_argument("--depth", type=int, default=1000, help="keyed: messages a key (1000)")
    parser.add_argument(
        "--claims", type=int, default=200, help="keyed: claims timed per statement (200)"
    )
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


async def claim_keyed_locked(conn: asyncpg.Connection, batch: int) -> list[asyncpg.Record]:
    """Python handlers' keyed claim: lock the key heads and their runs, unchanged."""
    rows: list[asyncpg.Record] = await conn.fetch(LOCK_KEYED, ["bench"], batch)
    return rows


async def claim_keyed_leased(conn: asyncpg.Connection, batch: int) -> list[asyncpg.Record]:
    """Forwards' keyed claim: lease the key heads and their runs (`processing`)."""
    rows: list[asyncpg.Record] = await conn.fetch(CLAIM_KEYED, ["bench"], [30.0], batch)
    return rows


KEYED_SIDES = {"locked": claim_keyed_locked, "leased": claim_keyed_leased}


async def fill_keyed(conn: asyncpg.Connection, args: argparse.Namespace, analyzed: str) -> None:
    """`--keys` x `--depth` keyed messages, inside PostgreSQL, analyzed before the fill
    (`empty`) or after it (`fresh`). Autovacuum is off for the table meanwhile (`measure_keyed`):
    its ANALYZE would turn the one regime into the other mid-run."""
    await conn.execute("TRUNCATE inbox_messages, inbox_claims, inbox_attempts")
    if analyzed == "empty":
        await conn.execute("ANALYZE inbox_messages")
    await conn.execute(INSERT_KEYED, BODY_TEMPLATE, args.keys * args.depth, args.keys)
    if analyzed == "fresh":
        await conn.execute("ANALYZE inbox_messages")
    await conn.execute("CHECKPOINT")


async def keyed_plan(conn: asyncpg.Connection, batch: int) -> str:
    """LOCK_KEYED's plan, without costs: the shape the planner chose."""
    await conn.execute(CLAIM_BEGIN)
    try:
        rows = await conn.fetch(f"EXPLAIN (COSTS off) {LOCK_KEYED}", ["bench"], batch)
        return "\n".join(r[0] for r in rows)
    finally:
        await conn.execute("ROLLBACK")


async def time_keyed_claims(
    conn: asyncpg.Connection, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Milliseconds of each keyed claim of `--batch-size`, `--claims` of each side taken in
    turn, each in its own transaction (as the worker opens it, CLAIM_BEGIN); its rows are then
    finished as processed, so the heads move on and the backlog stays near `--depth` deep."""
    times: dict[str, list[float]] = {name: [] for name in KEYED_SIDES}
    for _ in range(args.claims):
        for name, claim in KEYED_SIDES.items():
            leased = name == "leased"
            await conn.execute(CLAIM_BEGIN)
            started = time.perf_counter()
            rows = await claim(conn, args.batch_size)
            times[name].append((time.perf_counter() - started) * 1000)
            if len(rows) != args.batch_size:
                raise SystemExit(f"keyed {name}: claimed {len(rows)} of {args.batch_size}")
            if leased:  # the lease commits before anything runs; the finish is another trip
                await conn.execute("COMMIT; BEGIN")
            finishing = ["processing"] if leased else ["pending", "retrying"]
            await conn.fetch(FINISH_ATTEMPTS, outcomes(rows, leased), finishing, "bench")
            await conn.execute("COMMIT")
    return times


def percentile(values: Sequence[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


async def measure_keyed(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each regime of statistics in turn, empty first: the database's table has never been
    analyzed with keyed rows in it, so `empty` is what a first burst of keys meets."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    result: dict[str, Any] = {}
    try:
        await conn.execute("ALTER TABLE inbox_messages SET (autovacuum_enabled = off)")
        for analyzed in STATISTICS:
            await fill_keyed(conn, args, analyzed)
            plan = await keyed_plan(conn, args.batch_size)
            times = await time_keyed_claims(conn, args)
            result[analyzed] = {"plan": plan, "ms": times}
            for name, ms in times.items():
                print(
                    f"keyed {name:6} {analyzed:5} statistics: p50 {percentile(ms, 50):6.2f} ms, "
                    f"p99 {percentile(ms, 99):6.2f} ms, slowest {max(ms):6.2f} ms",
                    flush=True,
                )
    finally:
        await conn.execute("ALTER TABLE inbox_messages RESET (autovacuum_enabled)")
        await conn.close()
    return result


def report_keyed(keyed: dict[str, Any], args: argparse.Namespace) -> bool:
    """The keyed claims' percentiles and the target's verdict (True: met)."""
    print(
        f"\nkeyed claims of {args.batch_size}, {args.keys} keys x {args.depth} deep, "
        f"{args.claims} each: p50 / p99 ms (target p99 <= {KEYED_P99_TARGET_MS:g})"
    )
    met = True
    for analyzed, regime in keyed.items():
        for name, ms in regime["ms"].items():
            p99 = percentile(ms, 99)
            met = met and p99 <= KEYED_P99_TARGET_MS
            print(f"{name:6} {analyzed:5} statistics  {percentile(ms, 50):6.2f} / {p99:6.2f}")
    plans = {regime["plan"] for regime in keyed.values()}
    print(f"LOCK_KEYED's plan the same with either statistics: {len(plans) == 1}")
    print(f"keyed target: {'met' if met else 'MISSED'}")
    return met


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
            await migrate(url)
            # Keyed first: `empty` must meet a table never analyzed with keyed rows in it.
            keyed = await measure_keyed(url, args) if args.part != "drains" else {}
            runs = await measure(url, args) if args.part != "keyed" else {}
            settings = await pg.settings()
        finally:
            await pg.drop_database(url)
    if runs:
        report(runs)
    if keyed:
        report_keyed(keyed, args)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"claims-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document: dict[str, Any] = {
        "args": vars(args),
        "postgres": settings,
        "runs": runs,
        "keyed": keyed,
    }
    path.write_text(json.dumps(document, indent=2))
    print(f"postgres: {settings}\nload average at end: {os.getloadavg()}\nresults: {path}")


if __name__ == "__main__":
    asyncio.run(main())
