"""A rate-limited source's rate and wait, in the admin stats and /metrics (issue 52 item 2)."""

from __future__ import annotations

import asyncio

import asyncpg

from tests.admin_seed import AUTH, TOKEN
from tests.conftest import AppFactory
from tests.processing_helpers import config, delivery


async def test_the_stats_and_metrics_show_the_limit_its_rate_and_the_wait(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    limited = config("tests.handlers:record", rate_limit="5/s")
    async with worker_for(limited, admin_tokens=[TOKEN]) as client:
        for i in range(40):
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"m-{i}"))
        await asyncio.sleep(2.0)
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
        metrics = (await client.get("/metrics")).text
    (limit,) = stats["rate_limits"]
    assert (limit["source"], limit["rate_limit"], limit["per_second"]) == ("hooks", "5/s", 5.0)
    # A full bucket (5) then 5 a second: about 15 in 2 s, far from the 40 sent.
    processed = await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'processed'")
    assert 8 <= processed <= 20, processed
    assert 0 < limit["current_per_second"] <= 2.0
    assert limit["tokens"] <= 5.0
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == processed
    claimed = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('webhook_inbox_rate_limit_claimed_total{destination="",source="hooks"}')
    ]
    assert claimed == [float(processed)]
    assert 'webhook_inbox_rate_limit_wait_seconds_total{destination="",source="hooks"}' in metrics
