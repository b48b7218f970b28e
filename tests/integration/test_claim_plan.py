"""The claim walks the due index in its order whatever the statistics say, so a backlog the
planner has not seen yet drains at the rate a known one does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg

from service.core.db import create_engine
from service.core.settings import Settings
from service.store.claims import CLAIM_BEGIN, CLAIM_DUE, claim_due

BACKLOG = 20_000
CLAIM_ARGS = (["burst"], [30.0], 100, False)  # sources, leases, limit, alone


async def analyzed_before_the_burst(db: asyncpg.Connection) -> None:
    """The table as after an outage: analyzed while the inbox kept up (another source's
    processed rows, a few pending), then a backlog from a source its statistics have never
    seen, before autovacuum (kept off here) analyzes it again."""
    await db.execute("ALTER TABLE inbox_messages SET (autovacuum_enabled = false)")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body, status, processed_at) "
        "SELECT 'usual', 'u' || g, '{}', 'processed', now() FROM generate_series(1, $1) g",
        BACKLOG,
    )
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'usual', 'p' || g, '{}' FROM generate_series(1, 100) g"
    )
    await db.execute("ANALYZE inbox_messages")
    await db.execute("DELETE FROM inbox_messages WHERE status = 'pending'")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'burst', 'b' || g, '{}' FROM generate_series(1, $1) g",
        BACKLOG,
    )


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


async def claim_plan(db: asyncpg.Connection, begin: str) -> list[dict[str, Any]]:
    """The nodes of the plan the claim gets in a transaction begun with `begin` (not run)."""
    await db.execute(begin)
    try:
        explained = await db.fetchval("EXPLAIN (FORMAT JSON) " + CLAIM_DUE, *CLAIM_ARGS)
    finally:
        await db.execute("ROLLBACK")
    return list(nodes(json.loads(explained)[0]["Plan"]))


async def test_a_backlog_the_statistics_have_not_seen_is_claimed_in_due_index_order(
    db: asyncpg.Connection, database_url: str
) -> None:
    await analyzed_before_the_burst(db)
    # The arrangement does mislead the planner: left to itself, it sorts every due row.
    unguided = await claim_plan(db, "BEGIN")
    assert any(node["Node Type"] == "Sort" for node in unguided), unguided
    # The claim's own transaction leaves it the due index, read in order up to the limit.
    guided = await claim_plan(db, CLAIM_BEGIN)
    assert not any(node["Node Type"] == "Sort" for node in guided), guided
    scans = [node.get("Index Name") for node in guided if node["Node Type"] == "Index Scan"]
    assert "inbox_messages_due_idx" in scans, guided

    engine = create_engine(database_url, Settings(database_url="x"))
    try:
        claimed = await claim_due(engine, {"burst": 30.0}, 100)
    finally:
        await engine.dispose()
    assert [row.message_id for row in claimed] == [f"b{n}" for n in range(1, 101)]
    # The claim committed: the rows are leased, and its connection left no transaction open.
    leased = await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'processing'")
    assert leased == 100
