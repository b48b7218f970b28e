"""Rate limits (issue 52 item 2): one limit shared by every processing process on the
database, the messages over it waiting `pending` with no attempt spent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from tests.e2e.test_worker_processes import enqueue
from tests.processing_helpers import create_effects, source
from tests.worker_process import start_worker, stop, wait_listening

pytestmark = pytest.mark.slow

RATE = 50
TOML = f"""
[sources.hooks]
kind = "generic"
id_header = "X-Message-Id"
handlers = ["tests.handlers:record"]
rate_limit = "{RATE}/s"
"""
SETTINGS = {"INBOX_WORKER_BATCH_SIZE": "20", "INBOX_WORKER_CONCURRENCY": "2"}
WINDOW = 20.0


async def test_two_processes_share_one_limit_and_waiting_spends_no_attempt(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    workers = [start_worker(database_url, TOML, tmp_path, f"w{i}", **SETTINGS) for i in range(2)]
    try:
        await wait_listening(db, 2)
        await enqueue(db, 2 * RATE * int(WINDOW))  # twice what the window can take
        await asyncio.sleep(WINDOW + 3)
    finally:
        codes = [await stop(w) for w in workers]
    assert codes == [0, 0]
    # The steady rate, past the first second's burst (a full bucket: one second's worth).
    first = await db.fetchval("SELECT min(processed_at) FROM inbox_messages")
    in_window = await db.fetchval(
        "SELECT count(*) FROM inbox_messages "
        "WHERE processed_at >= $1::timestamptz + interval '1 second' "
        "AND processed_at < $1::timestamptz + make_interval(secs => $2::float8 + 1)",
        first,
        WINDOW,
    )
    rate = in_window / WINDOW
    actors = await db.fetchval("SELECT count(DISTINCT actor) FROM inbox_attempts")
    processed = await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'processed'")
    attempts = await db.fetchval("SELECT count(*) FROM inbox_attempts")
    pending = await db.fetchval(
        "SELECT count(*) FROM inbox_messages WHERE status = 'pending' AND attempts = 0"
    )
    print(f"rate_limit {RATE}/s, 2 processes: {rate:.1f} msgs/s over {WINDOW:g} s")
    assert abs(rate - RATE) <= RATE * 0.1, rate
    assert actors == 2  # both processes took part, within the one limit
    assert attempts == processed  # every attempt processed a message: none spent on waiting
    assert pending > 0  # the rest wait, untouched


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("0/s", "sources.hooks.rate_limit: a rate limit must be above zero"),
        ("100/h", "sources.hooks.rate_limit: write a rate limit as a count per second or minute"),
        (100, "sources.hooks.rate_limit: write a rate limit as a string"),
    ],
)
def test_a_rate_limit_written_wrong_stops_start_up_naming_it(value: object, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_inbox_config({"sources": {"hooks": source(rate_limit=value)}})
    assert str(raised.value).startswith(error), str(raised.value)
