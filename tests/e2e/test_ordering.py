"""Ordering keys (issue 52 item 1) across real `webhook-inbox worker` processes: each key's
messages are processed one at a time in the order they were accepted, while different keys
run concurrently; a SIGKILL mid-run changes none of it."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from tests.processing_helpers import create_effects, wait_until
from tests.worker_process import crash, start_worker, stop, wait_listening

pytestmark = pytest.mark.slow

KEYS, PER_KEY = 50, 40
TOTAL = KEYS * PER_KEY

TOML = """
[sources.hooks]
kind = "generic"
id_header = "X-Message-Id"
ordering_key = "/key"
handlers = ["tests.handlers:record_span"]
max_attempts = 10
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2
"""

SETTINGS = {
    "INBOX_WORKER_BATCH_SIZE": "20",
    "INBOX_WORKER_CONCURRENCY": "2",
    "INBOX_WORKER_LEASE_MARGIN_SECONDS": "1",
}

# Accepted interleaved: message g has key g % 50, so each key's 40 messages are spread over
# the whole backlog, as ingest stores them (tests/integration/test_ordering.py covers ingest).
INSERT = """
INSERT INTO inbox_messages (source, message_id, body, content_type, ordering_key)
SELECT 'hooks', 'm' || g, convert_to(json_build_object('key', 'k' || (g % 50))::text, 'UTF8'),
       'application/json', 'k' || (g % 50)
  FROM generate_series(1, $1) AS g
"""
PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"


async def enqueue(db: asyncpg.Connection) -> None:
    await db.execute(INSERT, TOTAL)
    await db.execute("NOTIFY webhook_inbox, 'hooks'")


async def assert_in_order_and_apart(db: asyncpg.Connection) -> float:
    """Each key's effects in acceptance (inbox id) order, none overlapping another of its key,
    one per message; returns the largest number of keys that ran at one moment."""
    rows = await db.fetch("SELECT inbox_id, payload FROM effects ORDER BY id")
    assert len(rows) == TOTAL
    assert len({r["inbox_id"] for r in rows}) == TOTAL  # nothing twice, nothing lost
    by_key: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    spans = []
    for r in rows:
        span = json.loads(r["payload"])
        by_key[span["key"]].append((r["inbox_id"], span["start"], span["end"]))
        spans.append((span["start"], span["end"]))
    assert len(by_key) == KEYS
    for key, effects in by_key.items():
        by_start = sorted(effects, key=lambda e: e[1])
        ids = [e[0] for e in by_start]
        assert ids == sorted(ids), f"{key} ran out of order: {ids[:10]}"
        for earlier, later in itertools.pairwise(by_start):
            assert earlier[2] <= later[1], f"{key}: {earlier[0]} and {later[0]} overlapped"
    # Different keys did run at once (else ordering would be a global lock).
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


async def start_three(
    database_url: str, db: asyncpg.Connection, tmp_path: Path, toml: str = TOML
) -> list[subprocess.Popen[bytes]]:
    """Three worker processes of `toml`, listening (the effects table created first)."""
    await create_effects(db)
    workers = [start_worker(database_url, toml, tmp_path, f"w{i}", **SETTINGS) for i in range(3)]
    try:
        await wait_listening(db, 3)
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers


async def kill_while_holding_claims(
    db: asyncpg.Connection, victim: subprocess.Popen[bytes], timeout: float = 60, at_least: int = 1
) -> None:
    """SIGKILL `victim` (the process itself, no graceful stop) once some messages are done, at
    a moment it holds `at_least` claims: mid-batch, so its claims are abandoned. It is frozen
    (SIGSTOP) while its claims are counted, so that its batch cannot commit between the count
    and the kill however loaded the machine; counted twice, so that a COMMIT it sent just
    before it froze has landed. Holding fewer, it is let go (SIGCONT) and watched again."""
    deadline = time.monotonic() + timeout
    holding = "SELECT count(*) FROM inbox_claims WHERE actor LIKE '%:' || $1::text"
    pid = str(victim.pid)
    while True:
        assert time.monotonic() < deadline, "no batch of the first process in flight"
        done = await db.fetchval(PROCESSED)
        assert done < TOTAL, "all done before a batch was caught"
        if done >= 50 and await db.fetchval(holding, pid) >= at_least:
            victim.send_signal(signal.SIGSTOP)
            counts = [await db.fetchval(holding, pid) for _ in range(2)]
            if min(counts) >= at_least:
                crash(victim)
                return
            victim.send_signal(signal.SIGCONT)
        await asyncio.sleep(0.002)


async def drain_with_three(
    database_url: str,
    db: asyncpg.Connection,
    tmp_path: Path,
    meanwhile: Callable[[list[subprocess.Popen[bytes]]], Awaitable[None]] | None = None,
) -> list[int]:
    """The backlog (`enqueue`) drained by three worker processes, `meanwhile` done to them
    while they drain; each one's exit status once stopped (a killed one's, -9)."""
    workers = await start_three(database_url, db, tmp_path)
    try:
        await enqueue(db)
        if meanwhile is not None:
            await meanwhile(workers)
        await wait_until(db, PROCESSED, TOTAL, 120)
    finally:
        codes = [await stop(w) for w in workers]
    return codes


async def test_three_processes_keep_each_keys_order_and_run_keys_concurrently(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    codes = await drain_with_three(database_url, db, tmp_path)
    assert codes == [0, 0, 0]
    peak = await assert_in_order_and_apart(db)
    actors = await db.fetchval("SELECT count(DISTINCT actor) FROM inbox_attempts")
    print(f"{TOTAL} messages, {KEYS} keys, 3 processes: up to {peak} keys at once")
    assert actors == 3
    assert peak >= 2


async def test_a_sigkill_mid_run_leaves_every_key_ordered_and_nothing_twice(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    codes = await drain_with_three(
        database_url,
        db,
        tmp_path,
        lambda workers: kill_while_holding_claims(db, workers[0], at_least=5),
    )
    assert codes[0] == -signal.SIGKILL
    await assert_in_order_and_apart(db)
    abandoned = await db.fetchval("SELECT count(*) FROM inbox_attempts WHERE outcome = 'abandoned'")
    print(f"SIGKILL mid-run: {abandoned} attempts abandoned, every key still in order")
    assert abandoned > 0  # the kill landed inside a batch
