"""Named forward destinations run like a source's forward (issue 63 item 4): leased, with no
database transaction open and no row locked while the HTTP call is out, their outcomes
recorded after it with the message's handler destinations, whose effects still commit with
their processed marks."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from tests.conftest import AppFactory
from tests.http_server import HANG, scripted_server
from tests.processing_helpers import delivery, source, wait_until

LEDGER = {"handlers": ["tests.handlers:record_billing"]}
# Connections that have sat in an open transaction for the last 0.5 s: a batch's transaction
# held across the call would be one (the call has been out for a second by then); the
# bookkeeping transactions of a poll, a few round trips long, are not.
IN_TRANSACTION = """
    SELECT count(*) FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
       AND state LIKE 'idle in transaction%'
       AND state_change < now() - interval '0.5 seconds'
"""


async def test_no_transaction_is_open_and_no_row_locked_while_a_forward_is_out(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with scripted_server((HANG, {})) as crm:
        forward = {"url": crm.url, "timeout_seconds": 3}
        hooks = source(destinations={"crm": {"forward": forward}, "ledger": LEDGER})
        async with worker_for({"sources": {"hooks": hooks}}) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
            await asyncio.wait_for(crm.arrived.wait(), 10)
            # Look once the call has been out for a second (it hangs for 3).
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - crm.requests[0].at)))
            # The call hangs: the message is leased (processing), not locked, and no
            # connection of the worker sits in a transaction.
            held = await db.fetchval(IN_TRANSACTION)
            async with db.transaction():
                locked = await db.fetchrow(
                    "SELECT status, attempts FROM inbox_messages FOR UPDATE NOWAIT"
                )
            assert held == 0
            assert (locked["status"], locked["attempts"]) == ("processing", 1)
            # The call times out: a failed attempt of the crm's; the ledger's effect applied
            # with its processed mark, once; then the crm's retry succeeds.
            await wait_until(
                db,
                "SELECT count(*) FROM inbox_destinations WHERE status = 'processed'",
                2,
                timeout=20,
            )
    rows = await db.fetch(
        "SELECT destination, outcome FROM inbox_attempts ORDER BY attempt, destination"
    )
    assert [tuple(r) for r in rows] == [
        ("crm", "failed"),
        ("ledger", "processed"),
        ("crm", "processed"),
    ]
    assert await db.fetchval("SELECT count(*) FROM effects") == 1
    assert len(crm.requests) == 2
    keys = {r.headers["idempotency-key"] for r in crm.requests}
    assert keys == {"hooks:m-1:crm"}  # the same key on every attempt
