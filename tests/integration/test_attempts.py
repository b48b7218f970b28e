"""Attempts count before handlers run: a stuck, blocking or vanished attempt is still counted."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from service.core.db import create_engine
from service.core.settings import Settings
from service.processing.pipeline import resolve_pipelines
from service.sources.config_file import parse_inbox_config
from service.store.claims import SHOWN_STATUS, claim_due, hold_claimed, lock_due, record_claims
from service.worker.base import WorkerOptions
from service.worker.worker import Worker
from tests.conftest import AppFactory
from tests.processing_helpers import (
    attempts_of,
    config,
    create_effects,
    delivery,
    insert_messages,
    status_of,
    wait_until,
)

PG_SLEEPING = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE query LIKE 'SELECT pg_sleep(3600)%' AND datname = current_database()"
)


async def assert_abandoned_then_run_alone(db: asyncpg.Connection, *message_ids: str) -> None:
    """Each message's first attempt was counted and never finished (abandoned), and its second
    ran in a transaction of its own: finishing cleared the flag, every effect is attempt 2's."""
    for name in message_ids:
        attempts = await attempts_of(db, name)
        assert [a["outcome"] for a in attempts] == ["abandoned", "processed"]
        assert attempts[0]["error_type"] == "AttemptNeverFinished"
        assert "never finished" in attempts[0]["error"]
        assert attempts[1]["attempt"] == 2
    assert await db.fetchval("SELECT count(*) FROM inbox_messages WHERE run_alone") == 0
    runs = await db.fetch("SELECT DISTINCT attempt FROM effects")
    assert [r["attempt"] for r in runs] == [2]


async def test_a_handler_stuck_in_a_statement_is_cancelled_on_the_server_and_counted(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # One batch: the stuck message between healthy ones, which must not share its fate.
    await insert_messages(db, "a", "stuck", "b")
    cfg = config("tests.handlers:stuck_in_database", handler_timeout_seconds=1, max_attempts=2)
    async with worker_for(cfg):
        await wait_until(
            db, "SELECT status FROM inbox_messages WHERE message_id = 'stuck'", "dead", 15
        )
        # Nothing of it is still running on the server.
        assert await db.fetchval(PG_SLEEPING) == 0
    attempts = await attempts_of(db, "stuck")
    assert [a["outcome"] for a in attempts] == ["failed", "dead"]
    assert {a["error_type"] for a in attempts} == {"HandlerTimeout"}
    assert all(a["duration_ms"] < 5_000 for a in attempts)
    for healthy in ("a", "b"):
        assert [a["outcome"] for a in await attempts_of(db, healthy)] == ["processed"]
    effects = await db.fetch("SELECT message_id FROM effects ORDER BY message_id")
    assert [r["message_id"] for r in effects] == ["a", "b"]


async def test_a_handler_blocking_the_loop_past_its_timeout_fails_and_is_named_in_the_log(
    worker_for: AppFactory, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config("tests.handlers:block_loop", handler_timeout_seconds=1, max_attempts=1)
    caplog.set_level(logging.WARNING, logger="service.worker.watchdog")
    async with worker_for(cfg) as client:
        body = b'{"sleep": 1.6}'
        await client.post("/webhooks/hooks", content=body, headers=delivery("blocker"))
        await wait_until(db, "SELECT status FROM inbox_messages", "dead", 15)
    (attempt,) = await attempts_of(db, "blocker")
    assert attempt["error_type"] == "HandlerTimeout"
    assert await db.fetchval("SELECT count(*) FROM effects") == 0
    # On a loaded machine the test process's own loop can also stall for a second outside any
    # handler (seen once in a full-suite run); the watchdog reports that too, naming no one.
    blocked = [
        r
        for r in caplog.records
        if r.getMessage().startswith("event loop blocked") and r.__dict__.get("handler")
    ]
    assert blocked, caplog.text
    assert blocked[0].__dict__["handler"] == "tests.handlers:block_loop"
    assert blocked[0].__dict__["message_id"] == "blocker"
    assert blocked[0].__dict__["source"] == "hooks"


async def test_an_attempt_whose_worker_vanished_is_counted_then_run_alone(
    worker_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    await insert_messages(db, "m1", "m2", "m3")
    cfg = config("tests.handlers:record")
    settings = Settings(database_url=database_url)
    engine = create_engine(database_url, settings)
    try:
        # A worker claims all three, then dies before running anything: only its claim
        # (committed, with the attempt counted) is left.
        claimed = await claim_due(engine, {"hooks": 0.2}, 10)
        assert [r.attempts for r in claimed] == [0, 0, 0]
        assert await db.fetchval("SELECT sum(attempts) FROM inbox_messages") == 3
    finally:
        await engine.dispose()
    async with worker_for(cfg):
        await wait_until(db, "SELECT count(*) FROM effects", 3, 15)
    await assert_abandoned_then_run_alone(db, "m1", "m2", "m3")


async def test_a_late_attempt_whose_claim_was_reaped_is_fenced_off(
    db: asyncpg.Connection, database_url: str
) -> None:
    await create_effects(db)
    await insert_messages(db, "m1")
    settings = Settings(database_url=database_url)
    engine = create_engine(database_url, settings)
    pipelines = resolve_pipelines(parse_inbox_config(config("tests.handlers:record")))
    worker = Worker(engine, database_url, pipelines, WorkerOptions(lease_margin_seconds=0.1))
    try:
        (late,) = await claim_due(engine, {"hooks": 0.1}, 1)
        await asyncio.sleep(0.3)
        assert await worker.reap_expired_leases() == 1
        await db.execute("UPDATE inbox_messages SET next_attempt_at = now()")  # no backoff
        (fresh,) = await claim_due(engine, {"hooks": 30}, 1, alone=True)
        assert fresh.attempts == 1
        async with engine.begin() as conn:
            # The late attempt may not lock (and so may not run or commit) its row any more.
            assert await hold_claimed(conn, [late]) == set()
            assert await hold_claimed(conn, [fresh]) == {fresh.id}
    finally:
        await engine.dispose()
    assert await status_of(db, "m1") == "processing"


async def test_expired_claims_of_a_source_removed_from_the_config_are_reaped(
    db: asyncpg.Connection, database_url: str
) -> None:
    # Messages of `gone` were claimed by workers that died, each way a worker claims: g1 with a
    # lease on its row (as forwards are), g2 by a batch of Python handlers (a claim row, the
    # message row left `pending`). `gone` has since been removed from the config, so no worker
    # will ever claim its rows again, nor run a batch that would record g2's claim.
    gone = "INSERT INTO inbox_messages (source, message_id, body) VALUES ('gone', $1, '{}')"
    await db.execute(gone, "g1")
    await insert_messages(db, "m1")
    settings = Settings(database_url=database_url)
    engine = create_engine(database_url, settings)
    pipelines = resolve_pipelines(parse_inbox_config(config("tests.handlers:record")))
    assert "gone" not in pipelines
    worker = Worker(engine, database_url, pipelines, WorkerOptions(lease_margin_seconds=0.1))
    shown = f"SELECT {SHOWN_STATUS} FROM inbox_messages WHERE message_id = $1"
    try:
        await claim_due(engine, {"gone": 0.1, "hooks": 0.1}, 10)
        await db.execute(gone, "g2")
        async with engine.connect() as conn:
            transaction = await conn.begin()
            batch = await lock_due(conn, ["gone"], 10)
            await record_claims(engine, batch.rows, {"gone": 0.1}, "test")
            await transaction.rollback()
        assert await db.fetchval(shown, "g2") == "processing"
        await asyncio.sleep(0.3)
        assert await worker.reap_expired_leases() == 3
        assert await worker.reap_expired_leases() == 0
    finally:
        await engine.dispose()
    # Not `processing` for good: retrying under the default policy, waiting for a worker that
    # has the source, each attempt recorded as the one that never finished.
    for name in ("g1", "g2", "m1"):
        assert await status_of(db, name) == "retrying"
        assert await db.fetchval(shown, name) == "retrying"
        (attempt,) = await attempts_of(db, name)
        assert (attempt["attempt"], attempt["outcome"]) == (1, "abandoned")
        assert attempt["error_type"] == "AttemptNeverFinished"
    assert await db.fetchval("SELECT count(*) FROM inbox_messages WHERE run_alone") == 3
    assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0


async def test_a_batch_that_vanished_after_counting_its_attempts_is_counted_then_run_alone(
    worker_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    await insert_messages(db, "m1", "m2", "m3")
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        # A batch locks the three and commits their claims, then its worker dies: the
        # transaction is gone, the claims (its attempts counted) are left.
        async with engine.connect() as conn:
            transaction = await conn.begin()
            batch = await lock_due(conn, ["hooks"], 10)
            await record_claims(engine, batch.rows, {"hooks": 0.2}, "test")
            await transaction.rollback()
        assert [r.attempts for r in batch.rows] == [0, 0, 0]
        assert await db.fetchval("SELECT count(*) FROM inbox_claims WHERE attempt = 1") == 3
    finally:
        await engine.dispose()
    async with worker_for(config("tests.handlers:record")):
        await wait_until(db, "SELECT count(*) FROM effects", 3, 15)
    await assert_abandoned_then_run_alone(db, "m1", "m2", "m3")
    assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0


async def test_a_live_claim_is_passed_over_and_a_late_rerun_is_fenced_off(
    db: asyncpg.Connection, database_url: str
) -> None:
    await create_effects(db)
    await insert_messages(db, "m1")
    engine = create_engine(database_url, Settings(database_url=database_url))
    pipelines = resolve_pipelines(parse_inbox_config(config("tests.handlers:record")))
    worker = Worker(engine, database_url, pipelines, WorkerOptions())
    try:
        # A batch's optimistic run rolled back; its claim stands until its rerun.
        async with engine.connect() as conn:
            transaction = await conn.begin()
            (mine,) = (await lock_due(conn, ["hooks"], 10)).rows
            await record_claims(engine, [mine], {"hooks": 30.0}, "test")
            await transaction.rollback()
        # Meanwhile another claim passes the message over.
        async with engine.begin() as conn:
            other = await lock_due(conn, ["hooks"], 10)
        assert (other.rows, other.abandoned) == ([], [])
        assert await worker.run_batch() == 0
        # The rerun locks it again by its claim.
        async with engine.begin() as conn:
            assert await hold_claimed(conn, [mine], leased=False) == {mine.id}
        # Once the claim has expired, the next claim records the attempt as abandoned, and a
        # rerun that comes even later may not lock (and so may not run or commit) the row.
        await db.execute("UPDATE inbox_claims SET locked_until = now() - interval '1 second'")
        assert await worker.run_batch() == 1
        async with engine.begin() as conn:
            assert await hold_claimed(conn, [mine], leased=False) == set()
    finally:
        await engine.dispose()
    row = await db.fetchrow("SELECT status, attempts, run_alone FROM inbox_messages")
    assert (row["status"], row["attempts"], row["run_alone"]) == ("retrying", 1, True)
    assert [a["outcome"] for a in await attempts_of(db, "m1")] == ["abandoned"]
    assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0
    assert await db.fetchval("SELECT count(*) FROM effects") == 0


async def test_a_batch_whose_claims_cannot_be_committed_runs_nothing_and_claims_again(
    db: asyncpg.Connection, database_url: str
) -> None:
    # The batch has locked its rows when the second connection fails to commit their claims
    # (here a trigger refuses them, as a full disk or a lost connection would): no handler may
    # run on an attempt that was not counted, and the rows go back as they were.
    await create_effects(db)
    await insert_messages(db, "m1", "m2")
    await db.execute(
        """
        CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'claims refused'; END $$;
        CREATE TRIGGER refuse_claims BEFORE INSERT ON inbox_claims
            FOR EACH STATEMENT EXECUTE FUNCTION refuse_claims();
        """
    )
    engine = create_engine(database_url, Settings(database_url=database_url))
    pipelines = resolve_pipelines(parse_inbox_config(config("tests.handlers:record")))
    worker = Worker(engine, database_url, pipelines, WorkerOptions())
    try:
        with pytest.raises(Exception, match="claims refused"):
            await worker.run_batch()
        assert await db.fetchval("SELECT count(*) FROM effects") == 0
        assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0
        assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0
        rows = await db.fetch("SELECT status, attempts FROM inbox_messages")
        assert {(r["status"], r["attempts"]) for r in rows} == {("pending", 0)}
        # Nothing is left locked: once the claims can be committed, the next claim runs both.
        await db.execute("DROP TRIGGER refuse_claims ON inbox_claims")
        assert await worker.run_batch() == 2
    finally:
        await engine.dispose()
    assert await db.fetchval("SELECT count(*) FROM effects") == 2
    for name in ("m1", "m2"):
        assert [a["outcome"] for a in await attempts_of(db, name)] == ["processed"]
        assert await status_of(db, name) == "processed"
    assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0
