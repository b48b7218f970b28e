"""The claim of a Python handlers' batch after a large backlog has churned `inbox_claims`:
its claim of each candidate is a probe of the primary key, a bounded number of buffers,
before and after ANALYZE (issue 70: as a join, up to 570 ms per claim of 100)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg

from service.store.claims import CLAIM_PLANS
from service.store.due import LOCK_DUE

PROCESSED = 50_000
BATCH = 5_000  # messages processed per round of the churn below
CLAIM = 100

# As the worker leaves them: each message claimed (a row in inbox_claims, committed), then
# processed and its claim deleted, autovacuum kept off so every dead row stays.
CLAIM_ROWS = """
    INSERT INTO inbox_claims (message_id, attempt, locked_until)
    SELECT id, 1, now() + interval '1 minute' FROM inbox_messages
     WHERE status = 'pending' ORDER BY id LIMIT $1
"""
FINISH_ROWS = """
    WITH done AS (DELETE FROM inbox_claims RETURNING message_id)
    UPDATE inbox_messages AS m SET status = 'processed', attempts = 1, processed_at = now()
      FROM done WHERE m.id = done.message_id
"""


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def buffers(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


async def explain_claim(db: asyncpg.Connection) -> dict[str, Any]:
    """The claim of the next 100, as `lock_due` runs it (its settings, in its transaction),
    explained with ANALYZE and BUFFERS, then rolled back."""
    tx = db.transaction()
    await tx.start()
    try:
        await db.execute(CLAIM_PLANS.text)
        found = await db.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {LOCK_DUE}", ["burst"], CLAIM
        )
    finally:
        await tx.rollback()
    plan: dict[str, Any] = json.loads(found)[0]["Plan"]
    return plan


def shape(plan: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [(n["Node Type"], n.get("Index Name"), n.get("Index Cond")) for n in nodes(plan)]


async def test_the_claim_after_50000_messages_reads_bounded_buffers_whatever_the_statistics(
    db: asyncpg.Connection,
) -> None:
    for table in ("inbox_messages", "inbox_claims"):
        await db.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "SELECT 'burst', 'b' || g, '{}' FROM generate_series(1, $1) g",
        PROCESSED + 10 * CLAIM,
    )
    for _ in range(PROCESSED // BATCH):
        await db.execute(CLAIM_ROWS, BATCH)
        await db.execute(FINISH_ROWS)
    claims = await db.fetchval("SELECT pg_relation_size('inbox_claims_pkey') / 8192")
    assert claims > 100  # the primary key holds every dead claim: a scan of it is not cheap

    # The first walk of the due index marks the processed messages' entries dead (the heap
    # visited once for each), as the worker's first claim after them does.
    await explain_claim(db)
    before = await explain_claim(db)
    await db.execute("ANALYZE inbox_messages")
    await db.execute("ANALYZE inbox_claims")
    after = await explain_claim(db)

    assert shape(before) == shape(after)
    assert abs(buffers(before) - buffers(after)) <= CLAIM // 10
    for plan in (before, after):
        assert plan["Actual Rows"] == CLAIM
        probes = [n for n in nodes(plan) if n.get("Relation Name") == "inbox_claims"]
        assert [(n["Node Type"], n["Index Name"]) for n in probes] == [
            ("Index Scan", "inbox_claims_pkey")
        ]
        assert probes[0]["Index Cond"] == "(message_id = m.id)"
        # Two pages a probe (the key's root and leaf), whatever the index's size.
        assert buffers(probes[0]) <= 3 * CLAIM
        # Besides the probes: the due index's walk past the processed messages' dead entries
        # (no vacuum here; a page for some 300) and the claimed rows' heap pages.
        assert buffers(plan) <= 3 * CLAIM + PROCESSED // 100
    print(f"claim of {CLAIM}: {buffers(before)} buffers before ANALYZE, {buffers(after)} after")
