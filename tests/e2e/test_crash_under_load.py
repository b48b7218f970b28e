"""A server SIGKILLed while deliveries stream in loses nothing it acknowledged, repeats nothing.

Guards two promises at once, end to end (real `webhook-inbox serve` with its in-process worker,
real PostgreSQL):
- a 2xx is sent only after the inbox row is committed: were ingest to answer before its group
  commit, the ids answered just before the kill would be missing after the restart;
- a handler's effect commits with the `processed` mark: were they committed apart (or the mark
  set before the effect), a batch cut short by the kill would leave an effect without its mark
  (run again after the restart: a duplicate) or a mark without its effect (a lost one).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.processing_helpers import create_effects, wait_until
from tests.server import ServerProcess, handler_source, serve_env

pytestmark = pytest.mark.slow

IDS = [f"load-{i}" for i in range(600)]
SENDERS = 16
KILL_AFTER_ACKS = 200

# `record_slowly` (10 ms a message) keeps the in-process worker's transactions open long
# enough that the kill lands inside a processing batch as well as among in-flight deliveries.
TOML = handler_source(
    "record_slowly", max_attempts=5, backoff_base_seconds=0.05, backoff_max_seconds=0.2
)

STORED = "SELECT count(*) FROM inbox_messages"
UNPROCESSED = "SELECT count(*) FROM inbox_messages WHERE status <> 'processed'"


def server_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    return serve_env(
        tmp_path,
        TOML,
        DATABASE_URL=database_url,
        INBOX_WORKER_BATCH_SIZE="50",
        # The killed server's claims expire 3 s after they were taken (30 s by default), so the
        # restart's time below is recovery and processing, not mostly waiting out the lease.
        INBOX_WORKER_LEASE_MARGIN_SECONDS="3",
    )


async def deliver_all(
    url: str, ids: list[str], on_ack: asyncio.Event | None = None
) -> dict[str, str]:
    """Send each id once from SENDERS concurrent clients; return the ids answered 2xx."""
    acked: dict[str, str] = {}
    queue = iter(ids)
    limits = httpx.Limits(max_connections=SENDERS)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10) as client:

        async def sender() -> None:
            for message_id in queue:  # a shared iterator: each id is taken by one sender
                try:
                    reply = await client.post(
                        "/webhooks/s", content=b'{"n": 1}', headers={"x-id": message_id}
                    )
                except httpx.TransportError:
                    continue  # the server died under this request: not acknowledged
                if 200 <= reply.status_code < 300:
                    acked[message_id] = reply.json()["status"]
                    if on_ack is not None and len(acked) >= KILL_AFTER_ACKS:
                        on_ack.set()

        await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return acked


async def test_sigkill_under_load_loses_no_acknowledged_id_and_repeats_no_effect(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    env = server_env(database_url, tmp_path)
    enough = asyncio.Event()
    with ServerProcess(env, tmp_path) as server:
        sending = asyncio.create_task(deliver_all(server.url, IDS, on_ack=enough))
        await asyncio.wait_for(enough.wait(), 30)
        await asyncio.to_thread(server.kill)  # mid-stream: SENDERS requests are in flight
        acked = await asyncio.wait_for(sending, 30)
    # The kill really landed mid-stream: some ids were acknowledged, some were not.
    assert KILL_AFTER_ACKS <= len(acked) < len(IDS)
    assert set(acked.values()) == {"accepted"}

    started = time.monotonic()
    with ServerProcess(env, tmp_path) as restarted:
        stored = {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}
        lost = set(acked) - stored
        assert not lost, f"acknowledged but lost: {sorted(lost)[:10]}"

        await wait_until(db, UNPROCESSED, 0, 30)
        assert await db.fetchval("SELECT count(*) FROM effects") == len(stored)
        assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == len(stored)

        # Every provider redelivers what it has no 2xx for, and sometimes what it has.
        again = await deliver_all(restarted.url, IDS)
        assert set(again) == set(IDS)
        assert {again[i] for i in stored} == {"duplicate"}
        assert {again[i] for i in set(IDS) - stored} <= {"accepted"}
        await wait_until(db, STORED, len(IDS), 10)
        await wait_until(db, UNPROCESSED, 0, 30)
    rows = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    counts = {r["message_id"]: r["n"] for r in rows}
    assert set(counts) == set(IDS)
    repeated = {k: n for k, n in counts.items() if n != 1}
    assert not repeated, f"applied more than once: {dict(itertools.islice(repeated.items(), 9))}"
    assert time.monotonic() - started < 60
