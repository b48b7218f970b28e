"""Ordering keys claimed from their heads (issue 63 item 6): a claim reads one index entry per
key and the run behind each due head, never the messages a head holds back; one hot key fills
a batch with its run in order; a run is never claimed behind another worker's head; and the
plan is the same with the statistics of an empty table as with fresh ones."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import create_engine
from service.core.settings import Settings
from service.store.claims import CLAIM_BEGIN, claim_due, lock_due
from service.store.due import LOCK_KEYED
from service.store.savepoints import batch_transaction
from tests.conftest import AppFactory
from tests.integration.test_claims import index_entries_read, nodes, read_since
from tests.processing_helpers import config, wait_until

FILL = """
INSERT INTO inbox_messages (source, message_id, body, ordering_key)
SELECT 'keyed', 'm' || g, '{}', 'k' || lpad((g % $2)::text, 4, '0')
  FROM generate_series(1, $1) AS g
"""


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, Settings(database_url="x"), pool_size=2)
    yield engine
    await engine.dispose()


@pytest.fixture(params=["empty", "fresh"])
async def analyzed(request: pytest.FixtureRequest, db: asyncpg.Connection) -> str:
    """When the table was last analyzed: before the backlog (an empty table) or after it."""
    await db.execute("ALTER TABLE inbox_messages SET (autovacuum_enabled = false)")
    if request.param == "empty":
        await db.execute("ANALYZE inbox_messages")
    return str(request.param)


async def fill(db: asyncpg.Connection, analyzed: str, messages: int, keys: int) -> None:
    await db.execute(FILL, messages, keys)
    if analyzed == "fresh":
        await db.execute("ANALYZE inbox_messages")


async def test_a_claim_over_deep_keys_reads_their_heads_not_their_backlog(
    db: asyncpg.Connection, engine: AsyncEngine, analyzed: str
) -> None:
    keys, deep = 200, 100
    await fill(db, analyzed, keys * deep, keys)
    await db.execute(CLAIM_BEGIN)
    try:
        explained = await db.fetchval("EXPLAIN (FORMAT JSON) " + LOCK_KEYED, ["keyed"], 100)
    finally:
        await db.execute("ROLLBACK")
    plan = list(nodes(json.loads(explained)[0]["Plan"]))
    # Index probes only (the pauses, a handful of rows, are read whole).
    assert not [n for n in plan if n["Node Type"] in ("Sort", "Bitmap Heap Scan")]
    scans = {n["Relation Name"] for n in plan if n["Node Type"] == "Seq Scan"}
    assert scans <= {"inbox_source_pauses"}, scans
    before = await index_entries_read(db, engine)
    async with batch_transaction(engine) as conn:
        batch = await lock_due(conn, ["keyed"], 100, keyed={"keyed"})
    read = read_since(before, await index_entries_read(db, engine))
    # A hundred heads, one per key, each the lowest id of its key.
    assert len(batch.rows) == 100
    assert len({row.ordering_key for row in batch.rows}) == 100
    assert all(row.id <= keys for row in batch.rows)
    # An entry or two per key and per claimed row: not the 20,000 behind them.
    assert read.get("inbox_messages_ordering_idx", 0) < 1_000, read
    assert "inbox_messages_due_idx" not in read, read


async def test_one_hot_key_fills_a_batch_with_its_run_in_order(
    db: asyncpg.Connection, engine: AsyncEngine, analyzed: str
) -> None:
    await fill(db, analyzed, 2_000, 1)
    first = await claim_due(engine, {"keyed": 30.0}, 100, keyed={"keyed"})
    assert [row.id for row in first] == list(range(1, 101))
    # The head is now processing: nothing of the key is due until it finishes.
    assert await claim_due(engine, {"keyed": 30.0}, 100, keyed={"keyed"}) == []


async def test_no_run_is_claimed_behind_another_workers_head(
    db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    await fill(db, "fresh", 300, 3)  # keys k0000, k0001, k0002; heads 3, 1, 2
    held = await db.fetchval("SELECT min(id) FROM inbox_messages WHERE ordering_key = 'k0001'")
    await db.execute("BEGIN")
    try:
        # Another worker holds k0001's head (id 1) in its batch's transaction.
        await db.execute("SELECT 1 FROM inbox_messages WHERE id = $1 FOR UPDATE", held)
        async with batch_transaction(engine) as conn:
            batch = await asyncio.wait_for(lock_due(conn, ["keyed"], 90, keyed={"keyed"}), 10)
    finally:
        await db.execute("ROLLBACK")
    keys = {row.ordering_key for row in batch.rows}
    assert keys == {"k0000", "k0002"}
    for key in keys:
        ids = [row.id for row in batch.rows if row.ordering_key == key]
        expected = await db.fetch(
            "SELECT id FROM inbox_messages WHERE ordering_key = $1 ORDER BY id LIMIT $2",
            key,
            len(ids),
        )
        assert ids == [r["id"] for r in expected]  # each from its head, unbroken


async def test_keyed_messages_of_a_source_run_unordered_here_are_claimed_once_they_appear(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # A rolling deploy: this worker has no ordering key for `hooks`, an older process still
    # stores keys. Its keyed messages arrive after it started, and are claimed in key order.
    async with worker_for(config("tests.handlers:record")):
        await db.execute(
            "INSERT INTO inbox_messages (source, message_id, body, ordering_key) "
            "SELECT 'hooks', 'k-' || g, '{}', 'k' || (g % 2) FROM generate_series(1, 6) AS g"
        )
        await wait_until(
            db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 6, timeout=20
        )
    order = [r["message_id"] for r in await db.fetch("SELECT message_id FROM effects ORDER BY id")]
    for key in (0, 1):
        of_key = [m for m in order if int(m[2:]) % 2 == key]
        assert of_key == sorted(of_key, key=lambda m: int(m[2:]))
