"""A rate-limited source's rate and wait, in the admin stats and /metrics (issue 52 item 2)."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from tests.admin_seed import AUTH, TOKEN
from tests.conftest import AppFactory
from tests.processing_helpers import config, delivery, wait_until

# No batch holds a message: none has a claim, and every unfinished row can be locked (a batch
# that locked rows before the pause may not have recorded its claims yet).
SETTLED = """
    SELECT (SELECT count(*) FROM inbox_claims) = 0
       AND (SELECT count(*) FROM (SELECT 1 FROM inbox_messages
                                   WHERE status IN ('pending', 'retrying')
                                     FOR UPDATE SKIP LOCKED) AS free)
         = (SELECT count(*) FROM inbox_messages WHERE status IN ('pending', 'retrying'))
"""


def claimed_metric(metrics: str) -> float | None:
    prefix = 'webhook_inbox_rate_limit_claimed_total{destination="",source="hooks"}'
    found = [
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)
    ]
    return found[0] if found else None


async def test_the_stats_and_metrics_show_the_limit_its_rate_and_the_wait(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    limited = config("tests.handlers:record", rate_limit="5/s")
    done = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
    async with worker_for(limited, admin_tokens=[TOKEN]) as client:
        started = time.monotonic()
        for i in range(40):
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"m-{i}"))
        await wait_until(db, f"SELECT ({done}) >= 10", True)
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
        # Paused, no claim is in flight once the claims are gone: what was processed stays.
        pause = {"operator": "test", "reason": "read the counts"}
        await client.post("/admin/sources/hooks/pause", json=pause, headers=AUTH)
        elapsed = time.monotonic() - started
        await wait_until(db, SETTLED, True)
        processed = await db.fetchval(done)
        deadline = time.monotonic() + 10
        while claimed_metric(metrics := (await client.get("/metrics")).text) != processed:
            assert time.monotonic() < deadline, (claimed_metric(metrics), processed)
            await asyncio.sleep(0.05)
    (limit,) = stats["rate_limits"]
    assert (limit["source"], limit["rate_limit"], limit["per_second"]) == ("hooks", "5/s", 5.0)
    # A full bucket (5) then 5 a second, whatever the machine's speed: far from the 40 sent.
    assert 10 <= processed <= 5 + 5 * elapsed + 1, (processed, elapsed)
    assert processed < 40
    assert 0 < limit["current_per_second"] <= 2.0
    assert limit["tokens"] <= 5.0
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == processed
    assert 'webhook_inbox_rate_limit_wait_seconds_total{destination="",source="hooks"}' in metrics
