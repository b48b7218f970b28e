"""Real `webhook-inbox worker` processes: two at once, and one killed in the middle of a batch."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import asyncpg
import psutil
import pytest

from service.core.collector import YOUNG_COLLECTION_THRESHOLD
from service.core.db import create_engine
from service.core.settings import Settings
from service.store.admin import discard_message
from tests.processing_helpers import create_effects, wait_until
from tests.server import handler_source
from tests.worker_process import crash, start_worker, stop, wait_listening

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
        crash(worker)
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


async def test_a_message_whose_worker_was_killed_is_discarded_at_once_and_never_runs_again(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    # The poison message kills its worker (os._exit mid-batch); its claim stays live for the
    # lease margin. The operator's discard goes through at once, and once the claim would
    # have expired, a fresh worker runs it no more: it stays discarded and its worker lives.
    await create_effects(db)
    toml = handler_source("exit_on_poison", "hooks", "X-Message-Id")
    victim = start_worker(database_url, toml, tmp_path, "victim")
    await wait_listening(db, 1)
    poison = await db.fetchval(
        "INSERT INTO inbox_messages (source, message_id, body, content_type) "
        "VALUES ('hooks', 'poison', '{}', 'application/json') RETURNING id"
    )
    await db.execute("NOTIFY webhook_inbox, 'hooks'")
    deadline = time.monotonic() + 30
    while victim.poll() is None:
        assert time.monotonic() < deadline, "the poison message did not kill its worker"
        await asyncio.sleep(0.05)
    claimed = await db.fetchval(
        "SELECT (SELECT count(*) FROM inbox_claims WHERE locked_until > now()) "
        "+ (SELECT count(*) FROM inbox_messages WHERE locked_until > now())"
    )
    assert claimed == 1  # killed with its claim live (the default 30 s lease margin)
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        row, changed = await discard_message(engine, poison, "operator")
    finally:
        await engine.dispose()
    assert (row["status"], changed) == ("discarded", True)
    # A worker whose lease margin is up long before this test ends, reaping and claiming.
    survivor = start_worker(
        database_url, toml, tmp_path, "survivor", INBOX_WORKER_LEASE_MARGIN_SECONDS="0.5"
    )
    try:
        await wait_listening(db, 1)
        await db.execute("UPDATE inbox_claims SET locked_until = now() - interval '1 second'")
        await db.execute("NOTIFY webhook_inbox, 'hooks'")
        await asyncio.sleep(3)
        assert survivor.poll() is None  # the poison did not run again
    finally:
        assert await stop(survivor) == 0
    assert await db.fetchval("SELECT status FROM inbox_messages") == "discarded"
    outcomes = await db.fetch("SELECT outcome FROM inbox_attempts WHERE message_id = $1", poison)
    assert [r["outcome"] for r in outcomes] == ["admin_discard"]
    assert await db.fetchval("SELECT count(*) FROM effects") == 0


async def test_the_worker_runs_at_the_configured_niceness(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """Every thread of a draining worker below ingest's priority (INBOX_WORKER_NICE); `serve`'s
    processing child runs the same command."""
    worker = start_worker(database_url, TOML, tmp_path, "nice", INBOX_WORKER_NICE="7")
    try:
        await wait_listening(db, 1)
        threads = psutil.Process(worker.pid).threads()
        assert {os.getpriority(os.PRIO_PROCESS, t.id) for t in threads} == {7}
    finally:
        assert await stop(worker) == 0
