"""The worker's claims: lease or lock due messages (`store.due` builds the statements), hold
a batch's rows, count a batch's attempts before its handlers run, and find expired claims."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.schema import Status
from service.store.due import (
    ALONE_DUE_SQL,
    CLAIM_ALONE,
    CLAIM_DUE,
    CLAIM_KEYED,
    KEYED_SOURCES,
    LOCK_DUE,
    LOCK_KEYED,
)
from service.store.errors import translate_errors
from service.store.results import MessageRow
from service.store.savepoints import driver_of, driver_transaction

# The claim's plan must not depend on statistics. A backlog the planner has not seen yet (a
# fresh table; a burst from a source that was rare when the table was last analyzed, as after
# an outage) is estimated at a few rows, and the planner then ANDs the due index with the
# source index into a bitmap and sorts every due row to return the first `limit`: 25-40 ms per
# claim of 100 from a 40,000-message backlog, growing with it, against 4 ms by the due index.
# Disabling sorts for the claim's transaction leaves that index walk as the only plan. The
# reaper's transaction does the same for the lease index (NO_SORTS).
_NO_SORTS = "SET LOCAL enable_sort TO off"
NO_SORTS = text(_NO_SORTS)
# Nor on its parameters: each claim statement's shape is fixed by how it is written (index
# probes in nested loops), so one generic plan per connection serves every execution. Left to
# choose, PostgreSQL planned the keyed claim (`due.keyed_runs`) anew on every execution, its
# generic plan's estimate being worse than its custom ones': 3 ms of planning for 3 ms of
# executing a claim of 100 heads (issue 63's every-gate drain).
_GENERIC_PLANS = "SET LOCAL plan_cache_mode TO force_generic_plan"
CLAIM_BEGIN = f"BEGIN; {_NO_SORTS}; {_GENERIC_PLANS}"


def keyed_share(
    sources: Sequence[str], keyed: Collection[str], limit: int
) -> tuple[list[str], int]:
    """The sources of `sources` whose keyed messages a claim of `limit` looks for, and how
    many of it they may take: all of it when every source is keyed, else half, so that
    neither a hot key nor a flood of unkeyed messages starves the other."""
    mine = [name for name in sources if name in keyed]
    if not mine:
        return [], 0
    return mine, limit if len(mine) == len(sources) else max(1, limit // 2)


async def claim_due(
    engine: AsyncEngine,
    leases: Mapping[str, float],
    limit: int,
    *,
    alone: bool = False,
    keyed: Collection[str] = (),
) -> list[MessageRow]:
    """Lease up to `limit` due messages of the sources in `leases` (seconds each), in id order.

    Committed at once (in a transaction of its own): the attempts count up by one before
    anything runs. `alone`: claim among the messages whose last attempt never finished.
    `keyed`: the sources that may hold messages with an ordering key, claimed from their
    keys' heads (`due.keyed_runs`), the rest from the due index.
    Sent on the driver connection: the batch's rows are built straight from asyncpg's records
    (its JSONB codec, set up by the dialect, decodes `headers`), not through SQLAlchemy's
    result rows.
    """
    names, seconds = list(leases), list(leases.values())
    ordered, share = ([], 0) if alone else keyed_share(names, keyed, limit)
    async with driver_transaction(engine, CLAIM_BEGIN) as driver:
        records = []
        if ordered:
            records = await driver.fetch(CLAIM_KEYED, ordered, [leases[n] for n in ordered], share)
        if len(records) < limit:
            records += await driver.fetch(
                CLAIM_ALONE if alone else CLAIM_DUE, names, seconds, limit - len(records)
            )
    return sorted((message_row(r) for r in records), key=lambda row: row.id)


def message_row(r: asyncpg.Record) -> MessageRow:
    """A claim's record (its first twelve columns, `due.ROW_COLUMNS` and the status it was
    claimed in) as a MessageRow."""
    return MessageRow(
        id=r[0],
        source=r[1],
        message_id=r[2],
        event_type=r[3],
        attempts=r[4],
        headers=r[5] or {},
        body=r[6],
        content_type=r[7],
        trace_context=r[8],
        budget_start=r[9],
        ordering_key=r[10],
        status=Status(r[11]),
    )


# The rows of a batch are found by id, on the primary key, never through an index on `status`:
# the batch's own statements compare `(m.status || '')`, which no index can answer. On the
# column, the planner (which sees few `processing` rows, rightly) walks the status index's
# `processing` range instead, and that range keeps an entry for every claim made since the
# last VACUUM. With no vacuum in between (PostgreSQL 15, batches of 100), the hold and the
# finish of a batch took the server 2.4 ms of CPU after 25,000 messages and 3.9 ms after
# 150,000; by id, 2.0-2.2 ms throughout.
BY_ID_STATUS = "(m.status || '')"

# The statements on a batch's rows find each by id, on the primary key (a nested loop over the
# batch), whatever size the planner believes the table to be. Left to its statistics, a plan
# made while the table was small (a fresh inbox, after a TRUNCATE, before autovacuum first
# analyzes it) reads the whole table and hash-joins the batch's rows instead, and a prepared
# statement keeps its generic plan until the next ANALYZE, however much the table grows
# meanwhile: at 2,500 deliveries/s for 15 s into an empty inbox, the finishes read 21 million
# rows in 1,334 sequential scans, and PostgreSQL spent 12-16 s of CPU on the 37,500 messages.
# Disabling sequential scans alone is not enough (a full scan of the primary key, hash-joined,
# is the small table's plan then), nor is planning every execution afresh (with small rows,
# 20,000 of them still cost less to scan than 100 probes, by the planner's reckoning). Set in
# the transaction of the statements that need it, which restores the defaults before any
# handler runs (RESTORE_PLANS) or ends after them. Every execution of those statements runs
# under it, so a generic plan is made under it too (a cached plan ignores later settings).
# One statement, which a prepared statement may be too.
BY_ID_PLANS = (
    "SELECT set_config('enable_seqscan', 'off', true), "
    "set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
)

# The fence before handlers run: lock the claimed rows this attempt still owns (status and
# attempts as claimed). A row whose lease expired and was reaped, or claimed again, is left
# out, so a late attempt never commits its effects over a newer one. Once locked, a row is
# skipped by the reaper and by other claims until this transaction ends, however long it runs.
HOLD_CLAIMED = text(
    f"""
    SELECT m.id
      FROM inbox_messages AS m
      JOIN unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[])) AS c(id, attempts)
        ON m.id = c.id
     WHERE {BY_ID_STATUS} = 'processing'
       AND m.attempts = c.attempts
     ORDER BY m.id
       FOR UPDATE OF m
    """  # noqa: S608 - a fixed expression, no input
)


async def hold_claimed(
    conn: AsyncConnection, rows: Sequence[MessageRow], *, leased: bool = True
) -> set[int]:
    """Lock `rows` for this transaction; the ids still owned by their claimed attempt.

    `leased`: claimed by `claim_due` (HOLD_CLAIMED); otherwise by `lock_due` and
    `record_claims`, a batch that runs again (HOLD_LOCKED). The transaction is left planning
    by id (BY_ID_PLANS): the caller restores the defaults (RESTORE_PLANS) before any handler
    runs.
    """
    params = {"ids": [r.id for r in rows], "attempts": [r.attempts + 1 for r in rows]}
    await conn.execute(text(BY_ID_PLANS))
    return {r.id for r in await conn.execute(HOLD_CLAIMED if leased else HOLD_LOCKED, params)}


# The plan of a locked claim (LOCK_DUE, LOCK_KEYED): the due index walked in order (NO_SORTS),
# each candidate's claim probed on `inbox_claims`' primary key (`due._CLAIM`), the batch's rows
# then found by id (BY_ID_PLANS). With sequential scans off, a probe of a churned, unvacuumed
# `inbox_claims` is never a scan of it: a claim of 100 from a backlog of a million read 311,
# 1,369 and 2,328 buffers (0.1-2.1 ms) at 0, 25 and 50 % drained, before and after ANALYZE,
# against up to 138,727 (53-128 ms) as a join (issue 70; docs/benchmarks.md).
CLAIM_PLANS = text(
    "SELECT set_config('enable_sort', 'off', true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true), "
    + BY_ID_PLANS.removeprefix("SELECT ")
)

# What a batch's transaction sends before any handler runs: its own statements' planner
# settings (NO_SORTS, BY_ID_PLANS, generic plans) are the inbox's, not the handlers'.
RESTORE_PLANS = (
    "SET LOCAL enable_sort TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT; "
    "SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT; "
    "SET LOCAL plan_cache_mode TO DEFAULT"
)


@dataclass(frozen=True)
class LockedBatch:
    """What `lock_due` locked: the rows to run, and those whose last attempt never finished."""

    rows: list[MessageRow]
    abandoned: list[MessageRow]


async def lock_due(
    conn: AsyncConnection, sources: Sequence[str], limit: int, *, keyed: Collection[str] = ()
) -> LockedBatch:
    """Lock up to `limit` due messages of `sources` in `conn`'s transaction (which this begins:
    call it first), in id order. `keyed`: as for `claim_due`.

    The claim's plan is the due index's, each claim probed by id (CLAIM_PLANS): sorts,
    sequential scans, hash and merge joins are left disabled, and the caller must restore them
    (RESTORE_PLANS, `MessageSavepoints.defer`) before any handler runs a statement in the
    transaction.
    """
    await conn.execute(CLAIM_PLANS)
    driver = await driver_of(conn)
    ordered, share = keyed_share(sources, keyed, limit)
    records = await driver.fetch(LOCK_KEYED, ordered, share) if ordered else []
    if len(records) < limit:
        records += await driver.fetch(LOCK_DUE, list(sources), limit - len(records))
    rows: list[MessageRow] = []
    abandoned: list[MessageRow] = []
    for r in sorted(records, key=lambda r: r[0]):
        (abandoned if r[12] else rows).append(message_row(r))
    return LockedBatch(rows, abandoned)


# The attempts of a locked batch, each with its lease (seconds), committed on its own. A claim
# left by an earlier attempt is taken over: the batch holds the message's lock.
RECORD_CLAIMS = """
    INSERT INTO inbox_claims AS c (message_id, attempt, locked_until, actor)
    SELECT id, attempt, clock_timestamp() + lease * interval '1 second', $4
      FROM unnest($1::bigint[], $2::int[], $3::float8[]) AS u(id, attempt, lease)
        ON CONFLICT (message_id) DO UPDATE
       SET attempt = excluded.attempt, locked_until = excluded.locked_until,
           actor = excluded.actor
"""


async def record_claims(
    engine: AsyncEngine, rows: Sequence[MessageRow], leases: Mapping[str, float], actor: str
) -> None:
    """Count the attempts of `rows` (locked by a batch's transaction on another connection of
    `engine`'s pool), committed before this returns."""
    if not rows:
        return
    async with translate_errors(), engine.connect() as conn:
        driver = await driver_of(conn)
        await driver.execute(
            RECORD_CLAIMS,
            [r.id for r in rows],
            [r.attempts + 1 for r in rows],
            [leases[r.source] for r in rows],
            actor,
        )


# What the admin shows: a message claimed by a batch of Python handlers is `processing`, with
# its attempt counted, as a leased one is, though its row stays `pending` or `retrying` (and
# its `attempts` as they were) until the batch commits. The claims (a few hundred rows at
# most) are hashed once per query. Over `inbox_messages`, unaliased.
_CLAIMED = (
    "status IN ('pending', 'retrying') AND (id, attempts + 1) IN "
    "(SELECT c.message_id, c.attempt FROM inbox_claims AS c)"
)
SHOWN_STATUS = f"CASE WHEN {_CLAIMED} THEN 'processing' ELSE status END"
# The ids of the claimed messages, for a listing of `processing` ones: through the primary key.
CLAIMED_IDS = "SELECT c.message_id FROM inbox_claims AS c"
SHOWN_ATTEMPTS = f"CASE WHEN {_CLAIMED} THEN attempts + 1 ELSE attempts END"


# A locked batch's rerun (after its optimistic run rolled back): lock again the rows whose
# claim is still this attempt's (`attempts`: the attempt's number, as for HOLD_CLAIMED). A row
# whose claim expired and was taken over is left out.
HOLD_LOCKED = text(
    f"""
    SELECT m.id
      FROM inbox_messages AS m
      JOIN unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[])) AS c(id, attempts)
        ON m.id = c.id
      JOIN inbox_claims AS k ON k.message_id = m.id AND k.attempt = c.attempts
     WHERE {BY_ID_STATUS} IN ('pending', 'retrying')
       AND m.attempts = c.attempts - 1
     ORDER BY m.id
       FOR UPDATE OF m
    """  # noqa: S608 - a fixed expression, no input
)


ALONE_DUE = text(ALONE_DUE_SQL)


async def keyed_sources(engine: AsyncEngine, sources: Sequence[str]) -> set[str]:
    """Those of `sources` that hold unfinished messages with an ordering key."""
    async with translate_errors(), engine.connect() as conn:
        driver = await driver_of(conn)
        return {r[0] for r in await driver.fetch(KEYED_SOURCES, list(sources))}


async def alone_due(engine: AsyncEngine, sources: Sequence[str]) -> bool:
    async with translate_errors(), engine.connect() as conn:
        return bool((await conn.execute(ALONE_DUE, {"sources": list(sources)})).scalar())


# Leases whose holder is gone (killed, partitioned, or just too slow): SKIP LOCKED so that
# several workers reaping at once split them; each is then finished as an abandoned attempt.
# Of every source, configured in this worker or not: the claim of a source removed from the
# config since would otherwise show `processing` for good, as no worker claims its rows.
EXPIRED_LEASES = text(
    """
    SELECT id, source, attempts, budget_start
      FROM inbox_messages
     WHERE status = 'processing'
       AND locked_until < now()
     ORDER BY locked_until
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
    """
)


@dataclass(frozen=True)
class ExpiredLease:
    """A claim whose holder is gone; `attempts` counts the attempt it never finished."""

    id: int
    source: str
    attempts: int
    budget_start: int


async def expired_leases(conn: AsyncConnection, limit: int) -> list[ExpiredLease]:
    """Lock up to `limit` expired leases (in the oldest first order of the lease index)."""
    await conn.execute(NO_SORTS)
    rows = await conn.execute(EXPIRED_LEASES, {"limit": limit})
    return [ExpiredLease(r.id, r.source, r.attempts, r.budget_start) for r in rows]


# Expired claims of Python handler batches (`inbox_claims`) of sources other than `:sources`.
# The next batch of a configured source records its own (LOCK_DUE), but no batch comes for a
# source removed from the config since, and its message would show `processing` for good
# (SHOWN_STATUS). Locked as LOCK_DUE locks them: a batch that still holds its row, running past
# its claim, is passed over. `inbox_claims` holds a few hundred rows at most.
EXPIRED_CLAIMS = text(
    """
    SELECT m.id, m.source, m.attempts, m.budget_start
      FROM inbox_claims AS c
      JOIN inbox_messages AS m ON m.id = c.message_id AND c.attempt > m.attempts
     WHERE c.locked_until < now()
       AND m.status IN ('pending', 'retrying')
       AND m.source <> ALL(CAST(:sources AS text[]))
     LIMIT :limit
       FOR UPDATE OF m SKIP LOCKED
    """
)


async def expired_claims_of_other_sources(
    conn: AsyncConnection, sources: Sequence[str], limit: int
) -> list[ExpiredLease]:
    """Lock up to `limit` messages with an expired claim whose source is not in `sources`; to
    be finished with `finish_attempts(..., leased=False)`, which releases their claims."""
    rows = await conn.execute(EXPIRED_CLAIMS, {"sources": list(sources), "limit": limit})
    # The claimed attempt is not counted on the row yet: it is the one after `attempts`.
    return [ExpiredLease(r.id, r.source, r.attempts + 1, r.budget_start) for r in rows]
