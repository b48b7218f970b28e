"""A processing process SIGKILLed while messages fan out to three destinations (issue 51):
nothing is lost and no destination applies a message twice, though one of them was failing
and being retried alone when the process died."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.test_worker_processes import PROCESSED, enqueue
from tests.processing_helpers import create_effects, wait_until
from tests.worker_process import crash, start_worker, stop, wait_listening

pytestmark = pytest.mark.slow

MESSAGES = 300

TOML = """
[sources.hooks]
kind = "generic"
id_header = "X-Message-Id"
max_attempts = 10
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2

[sources.hooks.destinations.billing]
handlers = ["tests.handlers:record_billing_slowly"]

[sources.hooks.destinations.disputes]
handlers = ["tests.handlers:record_disputes_failing_three_times"]

[sources.hooks.destinations.warehouse]
handlers = ["tests.handlers:record_warehouse"]
"""

SETTINGS = {
    "INBOX_WORKER_BATCH_SIZE": "50",
    "INBOX_WORKER_CONCURRENCY": "1",
    "INBOX_WORKER_LEASE_MARGIN_SECONDS": "1",
}

PAIRS = """
SELECT message_id, payload->>'by' AS destination, count(*) AS n
  FROM effects GROUP BY 1, 2
"""


async def test_a_processing_process_killed_mid_fan_out_loses_and_repeats_nothing(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    worker = start_worker(database_url, TOML, tmp_path, "first", **SETTINGS)
    try:
        await wait_listening(db, 1)
        await enqueue(db, MESSAGES)
        deadline = time.monotonic() + 30
        while await db.fetchval("SELECT count(*) FROM effects") < 150:
            assert time.monotonic() < deadline, "no batch committed"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # inside a batch
        crash(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
    before = await db.fetchval(PROCESSED)
    assert before < MESSAGES  # the kill cut the fan-out short

    restarted = start_worker(database_url, TOML, tmp_path, "second", **SETTINGS)
    try:
        await wait_until(db, PROCESSED, MESSAGES, 90)
    finally:
        assert await stop(restarted) == 0
    pairs = {(r["message_id"], r["destination"]): r["n"] for r in await db.fetch(PAIRS)}
    expected = {
        (f"m{i}", name)
        for i in range(1, MESSAGES + 1)
        for name in ("billing", "disputes", "warehouse")
    }
    assert set(pairs) == expected  # nothing lost
    assert {n for n in pairs.values()} == {1}  # nothing applied twice
    states = await db.fetch(
        "SELECT destination, status, count(*) AS n FROM inbox_destinations GROUP BY 1, 2"
    )
    assert {(r["destination"], r["status"]): r["n"] for r in states} == {
        ("billing", "processed"): MESSAGES,
        ("disputes", "processed"): MESSAGES,
        ("warehouse", "processed"): MESSAGES,
    }
    # billing and warehouse ran once each per message, whatever disputes and the kill did;
    # a killed batch's attempts are recorded as abandoned, naming no destination.
    runs = await db.fetch(
        "SELECT destination, count(*) AS n FROM inbox_attempts "
        "WHERE outcome = 'processed' GROUP BY 1"
    )
    assert {r["destination"]: r["n"] for r in runs} == {
        "billing": MESSAGES,
        "disputes": MESSAGES,
        "warehouse": MESSAGES,
    }
