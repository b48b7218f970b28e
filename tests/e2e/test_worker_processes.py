"""Real `webhook-inbox worker` processes: two at once, and one killed in the middle of a batch."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import asyncpg
import pytest

from service.core.collector import YOUNG_COLLECTION_THRESHOLD
from tests.processing_helpers import create_effects, wait_until
from tests.server import handler_source
from tests.worker_process import start_worker, stop, wait_listening

pytestmark = pytest.mark.slow

TOML = handler_source("record_slowly", "hooks", "X-Message-Id")

INSERT_MESSAGES = """
INSERT INTO inbox_messages (source, message_id, event_type, body, content_type)
SELECT 'hooks', 'm' || g, 'test', convert_to('{"n": ' || g || '}', 'UTF8'), 'application/json'
  FROM generate_series(1, $1) AS g
"""

PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"


async def enqueue(db: asyncpg.Connection, count: int) -> None:
    """`count` pending messages of `hooks`, and the NOTIFY that ingest would send."""
    await db.execute(INSERT_MESSAGES, count)
    await db.execute("NOTIFY webhook_inbox, 'hooks'")


async def assert_each_effect_once(db: asyncpg.Connection, count: int) -> None:
    assert await db.fetchval("SELECT count(*) FROM effects") == count
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == count
    assert await db.fetchval(PROCESSED) == count


async def test_two_worker_processes_run_each_message_once(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    settings = {"INBOX_WORKER_BATCH_SIZE": "20", "INBOX_WORKER_CONCURRENCY": "2"}
    workers = [start_worker(database_url, TOML, tmp_path, f"w{i}", **settings) for i in range(2)]
    try:
        await wait_listening(db, 2)
        await enqueue(db, 1000)
        await wait_until(db, PROCESSED, 1000, 60)
    finally:
        codes = [await stop(w) for w in workers]
    assert codes == [0, 0]  # SIGTERM is a clean stop
    await assert_each_effect_once(db, 1000)
    actors = await db.fetchval("SELECT count(DISTINCT actor) FROM inbox_attempts")
    assert actors == 2  # both processes took part
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 1000


async def test_a_worker_process_runs_its_handlers_with_the_collector_settled(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """`webhook-inbox worker` (and so serve's processing child) freezes what start-up built and
    raises the young threshold before its first batch (service/core/collector.py)."""
    await create_effects(db)
    toml = handler_source("record_collector", "hooks", "X-Message-Id")
    worker = start_worker(database_url, toml, tmp_path, "collector")
    try:
        await wait_listening(db, 1)
        await enqueue(db, 1)
        await wait_until(db, PROCESSED, 1, 30)
    finally:
        assert await stop(worker) == 0
    settings = json.loads(await db.fetchval("SELECT payload FROM effects"))
    assert settings["threshold"][0] == YOUNG_COLLECTION_THRESHOLD
    assert settings["frozen"] > 10_000  # the modules and what loading them built


async def test_a_worker_killed_mid_batch_loses_and_repeats_nothing(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    # One loop, batches of 50 at ~10 ms a message: a kill lands inside a batch's transaction.
    # The killed batch's claims expire a second later, and count as attempts.
    settings = {
        "INBOX_WORKER_BATCH_SIZE": "50",
        "INBOX_WORKER_CONCURRENCY": "1",
        "INBOX_WORKER_LEASE_MARGIN_SECONDS": "1",
    }
    worker = start_worker(database_url, TOML, tmp_path, "first", **settings)
    try:
        await wait_listening(db, 1)
        await enqueue(db, 300)
        deadline = time.monotonic() + 30
        while await db.fetchval(PROCESSED) < 60 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # well inside the next batch
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
    done_before_restart = await db.fetchval(PROCESSED)
    assert 50 <= done_before_restart < 300
    assert done_before_restart % 50 == 0  # whole batches committed, the killed one not at all
    assert await db.fetchval("SELECT count(*) FROM effects") == done_before_restart

    restarted = start_worker(database_url, TOML, tmp_path, "second", **settings)
    try:
        await wait_until(db, PROCESSED, 300, 60)
    finally:
        assert await stop(restarted) == 0
    await assert_each_effect_once(db, 300)
    # The killed batch: its attempt counted (abandoned), then processed on the second.
    killed = await db.fetchval("SELECT count(*) FROM inbox_messages WHERE attempts = 2")
    assert killed == 50
    outcomes = await db.fetch(
        "SELECT outcome, count(*) AS n FROM inbox_attempts GROUP BY outcome ORDER BY outcome"
    )
    assert {r["outcome"]: r["n"] for r in outcomes} == {"abandoned": 50, "processed": 300}
