"""The worker's claims: their statements read their partial indexes whatever the statistics
say (a backlog the planner has not seen yet drains at the rate a known one does), and a claim
cut short leaves no transaction open on a pooled connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import create_engine
from service.core.settings import Settings
from service.core.status import Status
from service.store.admin import MessageFilter, list_messages
from service.store.attempts import (
    FINISH_ATTEMPTS,
    LEASED,
    finish_attempts,
    outcomes_document,
    record_results,
)
from service.store.claims import (
    ALONE_DUE,
    BY_ID_STATUS,
    CLAIM_BEGIN,
    EXPIRED_LEASES,
    HOLD_CLAIMED,
    NO_SORTS,
    claim_due,
    expired_leases,
    hold_claimed,
    lock_due,
)
from service.store.due import CLAIM_ALONE, CLAIM_DUE, LOCK_DUE
from service.store.results import AttemptResult, MessageRow
from service.store.savepoints import driver_of

BACKLOG = 20_000
CLAIM_ARGS = (["burst"], [30.0], 100)  # sources, leases, limit


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """One connection, so the statistics it reports are those of the code under test."""
    engine = create_engine(database_url, Settings(database_url="x"), pool_size=1)
    yield engine
    await engine.dispose()


async def index_entries_read(db: asyncpg.Connection, engine: AsyncEngine) -> dict[str, int]:
    """How many entries each index of inbox_messages has returned so far, counting what
    `engine`'s connection and `db` read until now (each made to report it first)."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_stat_force_next_flush()"))
    await db.execute("SELECT pg_stat_force_next_flush()")
    await db.execute("SELECT pg_stat_clear_snapshot()")
    rows = await db.fetch(
        "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes "
        "WHERE relname = 'inbox_messages'"
    )
    return {r["indexrelname"]: r["idx_tup_read"] for r in rows}


def read_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: n - before[name] for name, n in after.items() if n > before[name]}


@pytest.fixture
async def stale(db: asyncpg.Connection) -> asyncpg.Connection:
    """The table as after an outage: analyzed while the inbox kept up (another source's
    processed rows, a few pending and in flight), then a backlog from a source its statistics
    have never seen, before autovacuum (kept off here) analyzes it again. Three of the
    backlog's claims have expired, and one message must run alone."""
    await db.execute("ALTER TABLE inbox_messages SET (autovacuum_enabled = false)")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body, status, processed_at) "
        "SELECT 'usual', 'u' || g, '{}', 'processed', now() FROM generate_series(1, $1) g",
        BACKLOG,
    )
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body, status, locked_until) "
        "SELECT 'usual', 'p' || g, '{}', CASE WHEN g % 2 = 0 THEN 'pending' ELSE 'processing' "
        "END, now() FROM generate_series(1, 100) g"
    )
    await db.execute("ANALYZE inbox_messages")
    await db.execute("DELETE FROM inbox_messages WHERE status <> 'processed'")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'burst', 'b' || g, '{}' FROM generate_series(1, $1) g",
        BACKLOG,
    )
    await db.execute(
        "UPDATE inbox_messages SET status = 'processing', attempts = 1, "
        "locked_until = now() - interval '1 minute' WHERE message_id IN ('b1', 'b2', 'b3')"
    )
    await db.execute(
        "UPDATE inbox_messages SET run_alone = true, status = 'retrying', attempts = 1 "
        "WHERE message_id = 'b15000'"
    )
    return db


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def sorts(plan: list[dict[str, Any]]) -> bool:
    return any(node["Node Type"] == "Sort" for node in plan)


def index_scans(plan: list[dict[str, Any]]) -> list[str]:
    return [node["Index Name"] for node in plan if node["Node Type"] == "Index Scan"]


async def claim_plan(db: asyncpg.Connection, begin: str, claim: str) -> list[dict[str, Any]]:
    """The plan a claim gets in a transaction begun with `begin` (explained, not run)."""
    await db.execute(begin)
    try:
        explained = await db.fetchval("EXPLAIN (FORMAT JSON) " + claim, *CLAIM_ARGS)
    finally:
        await db.execute("ROLLBACK")
    return list(nodes(json.loads(explained)[0]["Plan"]))


async def plan_of(
    engine: AsyncEngine, statement: TextClause, params: dict[str, Any], *, guided: bool
) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        if guided:
            await conn.execute(NO_SORTS)
        explained = await conn.scalar(text("EXPLAIN (FORMAT JSON) " + statement.text), params)
        await conn.rollback()
    return list(nodes(explained[0]["Plan"]))


async def test_a_backlog_the_statistics_have_not_seen_is_claimed_in_due_index_order(
    stale: asyncpg.Connection, engine: AsyncEngine
) -> None:
    # The arrangement does mislead the planner: left to itself, it sorts every due row.
    assert sorts(await claim_plan(stale, "BEGIN", CLAIM_DUE))
    # The claim's own transaction leaves it the due index, read in order up to the limit.
    guided = await claim_plan(stale, CLAIM_BEGIN, CLAIM_DUE)
    assert not sorts(guided), guided
    assert "inbox_messages_due_idx" in index_scans(guided), guided

    before = await index_entries_read(stale, engine)
    claimed = await claim_due(engine, {"burst": 30.0}, 100)
    # claim_due itself got that plan: a hundred-odd entries of the due index, and none of an
    # index led by source (left to itself, the planner reads the burst's 20,000 there).
    read = read_since(before, await index_entries_read(stale, engine))
    assert set(read) <= {"inbox_messages_due_idx", "inbox_messages_pkey"}, read
    assert read["inbox_messages_due_idx"] < 1_000, read
    # The oldest due first: b1-b3 are leased already.
    assert [row.message_id for row in claimed] == [f"b{n}" for n in range(4, 104)]
    # The claim committed: the rows are leased, and its connection left no transaction open.
    leased = "SELECT count(*) FROM inbox_messages WHERE status = 'processing' AND attempts = 1"
    assert await stale.fetchval(leased) == 103


async def test_a_locked_claim_of_an_unseen_backlog_reads_the_due_index_in_order(
    stale: asyncpg.Connection, engine: AsyncEngine
) -> None:
    # As the leased claim above: left to itself, the planner sorts every due row.
    lock_args = (["burst"], 100)
    await stale.execute("BEGIN")
    try:
        explained = await stale.fetchval("EXPLAIN (FORMAT JSON) " + LOCK_DUE, *lock_args)
    finally:
        await stale.execute("ROLLBACK")
    assert sorts(list(nodes(json.loads(explained)[0]["Plan"])))

    before = await index_entries_read(stale, engine)
    async with engine.begin() as conn:
        batch = await lock_due(conn, ["burst"], 100)
        # Its transaction leaves sorts off until the worker restores them.
        assert (await conn.execute(text("SHOW enable_sort"))).scalar() == "off"
    read = read_since(before, await index_entries_read(stale, engine))
    assert set(read) <= {"inbox_messages_due_idx", "inbox_messages_pkey"}, read
    assert read["inbox_messages_due_idx"] < 1_000, read
    # The oldest due first (b1-b3 are leased), locked and left as they were.
    assert [row.message_id for row in batch.rows] == [f"b{n}" for n in range(4, 104)]
    assert batch.abandoned == []
    assert await stale.fetchval("SELECT count(*) FROM inbox_messages WHERE attempts = 1") == 4


async def test_the_message_that_must_run_alone_is_found_by_its_own_index(
    stale: asyncpg.Connection, engine: AsyncEngine
) -> None:
    look = await plan_of(engine, ALONE_DUE, {"sources": ["burst"]}, guided=False)
    assert index_scans(look) == ["inbox_messages_alone_idx"], look
    claim = await claim_plan(stale, CLAIM_BEGIN, CLAIM_ALONE)
    assert "inbox_messages_alone_idx" in index_scans(claim), claim

    before = await index_entries_read(stale, engine)
    (alone,) = await claim_due(engine, {"burst": 30.0}, 1, alone=True)
    assert alone.message_id == "b15000"
    read = read_since(before, await index_entries_read(stale, engine))
    assert set(read) <= {"inbox_messages_alone_idx", "inbox_messages_pkey"}, read


async def test_expired_leases_are_read_from_the_lease_index(
    stale: asyncpg.Connection, engine: AsyncEngine
) -> None:
    params = {"limit": 100}
    # Every source's leases (a source removed from the config included): no index led by
    # source to be tempted by, and the reaper's transaction rules out a sort besides.
    for guided in (False, True):
        plan = await plan_of(engine, EXPIRED_LEASES, params, guided=guided)
        assert index_scans(plan) == ["inbox_messages_lease_idx"], plan
        assert not sorts(plan), plan

    before = await index_entries_read(stale, engine)
    async with engine.begin() as conn:
        expired = await expired_leases(conn, 100)
    # expired_leases itself got that plan: the lease index, not the burst's 20,000 entries of
    # an index led by source.
    read = read_since(before, await index_entries_read(stale, engine))
    assert set(read) == {"inbox_messages_lease_idx"}, read
    ids = await stale.fetch(
        "SELECT id FROM inbox_messages WHERE message_id IN ('b1', 'b2', 'b3') ORDER BY id"
    )
    assert sorted(lease.id for lease in expired) == [r["id"] for r in ids]


async def test_a_claim_cancelled_mid_statement_leaves_no_transaction_in_the_pool(
    db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'burst', 'b' || g, '{}' FROM generate_series(1, 5) g"
    )
    lock = db.transaction()
    await lock.start()
    # The claim waits for this lock inside its transaction, and is cancelled there.
    await db.execute("LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
    claim = asyncio.create_task(claim_due(engine, {"burst": 30.0}, 100))
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'webhook-inbox' AND wait_event_type = 'Lock'"
    )
    async with asyncio.timeout(30):
        while not await db.fetchval(waiting):
            # Inside a transaction the activity view is read once and kept: read it afresh.
            await db.execute("SELECT pg_stat_clear_snapshot()")
            await asyncio.sleep(0.02)
    assert not claim.done()
    claim.cancel()
    assert isinstance((await asyncio.gather(claim, return_exceptions=True))[0], BaseException)
    await lock.rollback()

    # Nothing was claimed, and the next claims (on whatever connection the pool hands out)
    # run in transactions of their own and commit.
    claimed = [len(await claim_due(engine, {"burst": 30.0}, 2)) for _ in range(3)]
    assert claimed == [2, 2, 1]
    left = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'webhook-inbox' AND state LIKE 'idle in transaction%'"
    )
    assert left == 0
    assert await db.fetchval("SELECT count(*) FROM inbox_messages WHERE attempts = 1") == 5


async def test_recording_outcomes_outside_a_begun_transaction_is_refused_and_writes_nothing(
    db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    """The outcomes go to the driver connection; in a transaction SQLAlchemy has begun only
    lazily they would commit alone, apart from the effects they belong with."""
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body, status, attempts) "
        "VALUES ('burst', 'b1', '{}', 'processing', 1)"
    )
    row_id = await db.fetchval("SELECT id FROM inbox_messages")
    now = datetime.now(UTC)
    done = AttemptResult(row_id, 1, Status.PROCESSED, "processed", now, now)
    async with engine.begin() as conn:
        with pytest.raises(RuntimeError, match="transaction to have begun"):
            await finish_attempts(conn, [done], "test", leased=True)
    assert await db.fetchval("SELECT status FROM inbox_messages") == "processing"
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0


async def batch_plans(
    db: asyncpg.Connection, engine: AsyncEngine, ids: list[int], by_id: bool
) -> list[str]:
    """The indexes the hold and the finish of `ids` (first attempts) read, as planned now;
    `by_id=False`: with `status` compared as a column, as before."""
    hold, finish = HOLD_CLAIMED.text, FINISH_ATTEMPTS
    if not by_id:
        hold, finish = (
            hold.replace(BY_ID_STATUS, "m.status"),
            finish.replace(BY_ID_STATUS, "m.status"),
        )
    held = await plan_of(engine, text(hold), {"ids": ids, "attempts": [1] * len(ids)}, guided=False)
    outcomes = json.dumps(
        [{"id": i, "status": "processed", "attempt": 1, "expected": 1} for i in ids]
    )
    explained = await db.fetchval("EXPLAIN (FORMAT JSON) " + finish, outcomes, LEASED, "t")
    return index_scans(held) + index_scans(list(nodes(json.loads(explained)[0]["Plan"])))


async def test_a_batch_finds_its_rows_by_id_not_among_earlier_claims(
    db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    # Until a VACUUM, the status index keeps an entry for every claim ever made (each claim
    # writes a `processing` version of its row), while the statistics rightly see few rows in
    # flight. Here 20,000 earlier messages were claimed and processed since the last ANALYZE.
    await db.execute("ALTER TABLE inbox_messages SET (autovacuum_enabled = false)")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'burst', 'old' || g, '{}' FROM generate_series(1, $1) g",
        BACKLOG,
    )
    await db.execute("ANALYZE inbox_messages")
    await db.execute("UPDATE inbox_messages SET status = 'processing', attempts = 1")
    await db.execute("UPDATE inbox_messages SET status = 'processed'")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'burst', 'new' || g, '{}' FROM generate_series(1, 100) g"
    )
    claimed = await claim_due(engine, {"burst": 30.0}, 100)
    ids = [row.id for row in claimed]
    # The arrangement does mislead the planner: on the column, it reads the status index,
    # through the 20,000 earlier claims.
    assert "inbox_messages_status_received_idx" in await batch_plans(db, engine, ids, by_id=False)
    # The batch's own statements find their rows on the primary key (the finish's release of
    # their claims, on the claims' own).
    assert set(await batch_plans(db, engine, ids, by_id=True)) == {
        "inbox_messages_pkey",
        "inbox_claims_pkey",
    }

    now = datetime.now(UTC)
    before = await index_entries_read(db, engine)
    async with engine.begin() as conn:
        assert await hold_claimed(conn, claimed) == set(ids)
        results = [AttemptResult(i, 1, Status.PROCESSED, "processed", now, now) for i in ids]
        assert await finish_attempts(conn, results, "test", leased=True) == set(ids)
    read = read_since(before, await index_entries_read(db, engine))
    assert set(read) == {"inbox_messages_pkey"}, read
    assert (
        await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'processed'")
        == BACKLOG + 100
    )


async def rows_read(db: asyncpg.Connection, engine: AsyncEngine) -> int:
    """How many rows of inbox_messages every scan so far has returned (sequential scans
    and index fetches), counting what `engine`'s connection and `db` read until now."""
    await index_entries_read(db, engine)  # makes both report their statistics first
    return int(
        await db.fetchval(
            "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
            "WHERE relname = 'inbox_messages'"
        )
    )


@pytest.fixture
async def settled(database_url: str) -> AsyncIterator[AsyncEngine]:
    """One connection whose prepared statements use a generic plan from their first execution,
    as PostgreSQL's plan cache settles on by their sixth: made for the table as it was then,
    and kept until the next ANALYZE."""
    engine = create_engine(
        database_url,
        Settings(database_url="x"),
        pool_size=1,
        connect_args={"server_settings": {"plan_cache_mode": "force_generic_plan"}},
    )
    yield engine
    await engine.dispose()


async def pending(db: asyncpg.Connection, prefix: str, count: int) -> None:
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'burst', $1 || g, '{}' FROM generate_series(1, $2) g",
        prefix,
        count,
    )


UNGUIDED = "/* unguided */ " + FINISH_ATTEMPTS


async def finish_unguided(engine: AsyncEngine, rows: list[MessageRow]) -> None:
    """The finish as it was sent before, without BY_ID_PLANS (a statement of its own on the
    connection, which a comment makes it)."""
    async with engine.begin() as conn:
        driver = await driver_of(conn)
        await driver.fetch(UNGUIDED, outcomes_document(processed(rows), True), LEASED, "t")


def processed(rows: list[MessageRow]) -> list[AttemptResult]:
    now = datetime.now(UTC)
    return [AttemptResult(r.id, 1, Status.PROCESSED, "processed", now, now) for r in rows]


async def test_a_batch_planned_on_an_empty_inbox_finds_its_rows_by_id_once_it_has_grown(
    db: asyncpg.Connection, settled: AsyncEngine
) -> None:
    # A fresh inbox that autovacuum has not analyzed yet: five messages.
    await db.execute("ALTER TABLE inbox_messages SET (autovacuum_enabled = false)")
    await pending(db, "first", 5)
    first = await claim_due(settled, {"burst": 30.0}, 100)
    # Its plan, made on five rows, is kept.
    await finish_unguided(settled, first)

    # The inbox grows to 20,000 messages before anything analyzes it.
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body, status, processed_at) "
        "SELECT 'usual', 'u' || g, '{}', 'processed', now() FROM generate_series(1, $1) g",
        BACKLOG,
    )
    await pending(db, "second", 5)
    second = await claim_due(settled, {"burst": 30.0}, 100)
    before = await rows_read(db, settled)
    await finish_unguided(settled, second)
    # The arrangement does mislead the planner: that plan reads the whole table.
    assert await rows_read(db, settled) - before > BACKLOG

    # The outcomes recorded apart (first: their finish makes the plan the batch's reuses), and
    # the batch's own statements, find their five rows each by id.
    await pending(db, "third", 10)
    third = await claim_due(settled, {"burst": 30.0}, 100)
    before = await rows_read(db, settled)
    assert await record_results(settled, processed(third[5:]), "t", leased=True) == {
        r.id for r in third[5:]
    }
    async with settled.begin() as conn:
        assert await hold_claimed(conn, third[:5]) == {r.id for r in third[:5]}
        assert await finish_attempts(conn, processed(third[:5]), "t", leased=True) == {
            r.id for r in third[:5]
        }
    assert await rows_read(db, settled) - before < 1_000
    done = "SELECT count(*) FROM inbox_messages WHERE source = 'burst' AND status = 'processed'"
    assert await db.fetchval(done) == 20


@pytest.mark.parametrize("statuses", [("processing",), ("processing", "dead")])
async def test_a_listing_of_processing_messages_reads_the_claims_not_the_backlog(
    stale: asyncpg.Connection, engine: AsyncEngine, statuses: tuple[str, ...]
) -> None:
    # The two oldest messages of the burst's 20,000 pending ones are claimed by a batch of
    # Python handlers; b1-b3 are leased. A listing of `processing` ones, newest first, must
    # not read the whole backlog to find the claimed ones at its far end. The statistics know
    # the backlog, as autovacuum's analyze has them soon after a burst.
    await stale.execute(
        "INSERT INTO inbox_claims (message_id, attempt, locked_until) "
        "SELECT id, 1, now() + interval '30 seconds' FROM inbox_messages "
        "WHERE message_id IN ('b4', 'b5')"
    )
    await stale.execute("ANALYZE inbox_messages")
    before = await rows_read(stale, engine)
    rows, _ = await list_messages(engine, MessageFilter(statuses=statuses), 50, None)
    read = await rows_read(stale, engine) - before
    assert sorted(r["message_id"] for r in rows) == ["b1", "b2", "b3", "b4", "b5"]
    assert {r["status"] for r in rows} == {"processing"}
    assert read < 1_000, read
