"""A backlog drained by a real `webhook-inbox worker` that is SIGKILLed mid-way and started
again, as after an outage and a crash (issue 70): every message processed once, none lost."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import asyncpg
import pytest

from tests.processing_helpers import create_effects, wait_until
from tests.server import handler_source
from tests.worker_process import start_worker, stop, wait_listening

pytestmark = pytest.mark.slow

BACKLOG = 20_000

TOML = handler_source("record", name="hooks", id_header="X-Message-Id", max_attempts=5)

SETTINGS = {"INBOX_WORKER_LEASE_MARGIN_SECONDS": "1"}

# Stored before any worker runs, as ingest stores an outage's deliveries.
INSERT = """
INSERT INTO inbox_messages (source, message_id, body, content_type)
SELECT 'hooks', 'm' || g, convert_to('{"n": ' || g || '}', 'UTF8'), 'application/json'
  FROM generate_series(1, $1) AS g
"""
PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
HOLDING = "SELECT count(*) FROM inbox_claims WHERE actor LIKE '%:' || $1::text"


async def test_a_backlog_drained_across_a_sigkill_processes_each_message_once(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    await db.execute(INSERT, BACKLOG)
    first = start_worker(database_url, TOML, tmp_path, "first", **SETTINGS)
    second = None
    try:
        deadline = time.monotonic() + 120
        # A third of the way in, at the first moment the worker holds a batch's claims.
        while await db.fetchval(PROCESSED) < BACKLOG // 3 or not await db.fetchval(
            HOLDING, str(first.pid)
        ):
            assert time.monotonic() < deadline, "no batch in flight a third of the way in"
            assert first.poll() is None, "the worker exited on its own"
            await asyncio.sleep(0.002)
        first.send_signal(signal.SIGKILL)
        first.wait()
        left = BACKLOG - await db.fetchval(PROCESSED)
        assert left > 0
        second = start_worker(database_url, TOML, tmp_path, "second", **SETTINGS)
        await wait_listening(db, 1)
        await wait_until(db, PROCESSED, BACKLOG, 180)
    finally:
        if first.poll() is None:
            first.kill()
        if second is not None:
            assert await stop(second) == 0
    effects = await db.fetchrow(
        "SELECT count(*) AS n, count(DISTINCT inbox_id) AS messages FROM effects"
    )
    assert (effects["n"], effects["messages"]) == (BACKLOG, BACKLOG)
    outcomes = dict(await db.fetch("SELECT outcome, count(*) FROM inbox_attempts GROUP BY outcome"))
    assert outcomes.get("abandoned", 0) > 0  # the kill landed inside a batch
    assert outcomes["processed"] == BACKLOG
    print(f"SIGKILL with {left} of {BACKLOG} left: {outcomes}")
