"""Backpressure: a stalled database gets bounded 503s, not an unbounded queue, then recovers."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from service.core.db import asyncpg_dsn
from tests.conftest import AppFactory

CONFIG = {"sources": {"s": {"kind": "generic", "id_header": "x-id"}}}


async def test_stalled_database_answers_503_in_bounded_time_then_recovers(
    client_for: AppFactory, database_url: str, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG, db_timeout_seconds=1, ingest_max_queued=40) as client:
        warm = await client.post("/webhooks/s", content=b"a", headers={"x-id": "warm"})
        assert warm.json()["status"] == "accepted"

        # Stall every write: the flushers' INSERTs wait on this lock.
        blocker = await asyncpg.connect(asyncpg_dsn(database_url))
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
        try:
            started = time.monotonic()
            replies = await asyncio.gather(
                *(
                    client.post("/webhooks/s", content=b"a", headers={"x-id": f"stalled-{i}"})
                    for i in range(120)
                )
            )
            elapsed = time.monotonic() - started
        finally:
            await tx.rollback()
            await blocker.close()

        assert {r.status_code for r in replies} == {503}, "nothing is acknowledged while stalled"
        assert all(int(r.headers["retry-after"]) > 0 for r in replies)
        assert elapsed < 6, f"503s took {elapsed:.1f}s; the wait must be bounded"
        refused_at_once = [r for r in replies if "too many" in r.json()["detail"]]
        assert refused_at_once, "the bounded queue refuses the overflow without waiting"

        # Same app, no restart: deliveries are accepted again once the database moves.
        await asyncio.sleep(0.5)
        started = time.monotonic()
        after = await asyncio.gather(
            *(
                client.post("/webhooks/s", content=b"a", headers={"x-id": f"after-{i}"})
                for i in range(30)  # fewer than the queue bound of 40
            )
        )
        assert all(r.json()["status"] == "accepted" for r in after)
        assert time.monotonic() - started < 5
        # A sender's retry of a refused delivery is recorded once, whatever became of it.
        retry = await client.post("/webhooks/s", content=b"a", headers={"x-id": "stalled-7"})
        assert retry.json()["status"] in {"accepted", "duplicate"}
    assert (
        await db.fetchval("SELECT count(*) FROM inbox_messages WHERE message_id = 'stalled-7'") == 1
    )


async def test_by_default_deliveries_arriving_during_a_write_share_the_next_one(
    client_for: AppFactory, database_url: str, db: asyncpg.Connection
) -> None:
    """One group-commit flusher by default (INBOX_INGEST_FLUSHERS): the deliveries that arrive
    while a write is under way wait for it and go together in the next, the largest batches
    and the least CPU a delivery. With two, a second write would take some of them at once."""
    async with client_for(CONFIG) as client:
        blocker = await asyncpg.connect(asyncpg_dsn(database_url))
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
        try:
            first = asyncio.ensure_future(
                client.post("/webhooks/s", content=b"a", headers={"x-id": "first"})
            )
            await asyncio.sleep(0.3)  # its write now waits on the lock
            rest = []
            for wave in range(2):  # a second flusher would take the first wave alone
                rest += [
                    asyncio.ensure_future(
                        client.post("/webhooks/s", content=b"a", headers={"x-id": f"{wave}-{i}"})
                    )
                    for i in range(10)
                ]
                await asyncio.sleep(0.3)
        finally:
            await tx.rollback()
            await blocker.close()
        replies = await asyncio.gather(first, *rest)
    assert {r.json()["status"] for r in replies} == {"accepted"}
    # The transaction that inserted each row: the first delivery's, and one for the rest.
    writes = await db.fetch(
        "SELECT xmin::text AS tx, count(*) AS n FROM inbox_messages GROUP BY 1 ORDER BY 2"
    )
    assert [w["n"] for w in writes] == [1, 20]
