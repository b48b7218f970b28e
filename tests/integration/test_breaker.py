"""The circuit breaker on a source's forward (issue 52 item 4): an endpoint that is down costs
at most `breaker_failures` attempts and one per probe, nothing goes dead because of it, and
everything is forwarded once it is back."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg

from tests.admin_seed import AUTH, TOKEN
from tests.conftest import AppFactory
from tests.http_server import scripted_server
from tests.processing_helpers import (
    breaker_forward,
    delivery,
    endpoint_back,
    most_calls_while_down,
    source,
    wait_until,
)

FAILURES, COOLDOWN, OUTAGE = 3, 1.0, 6.0
MESSAGES = 10


async def test_an_endpoint_down_for_a_while_costs_n_attempts_and_the_probes(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with scripted_server(*[(503, {})] * 1000) as server, scripted_server() as alerts:
        forward = breaker_forward(server.url, FAILURES, COOLDOWN)
        config = {
            "sources": {"hooks": source(forward=forward, max_attempts=10)},
            "alerts": {"webhooks": [alerts.url], "format": "json"},
        }
        async with worker_for(config, admin_tokens=[TOKEN], worker_alerts=True) as client:
            started = time.monotonic()
            for i in range(MESSAGES):
                await client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"m-{i}"))
            await asyncio.sleep(OUTAGE)
            during = len(server.requests)
            listed = (await client.get("/admin/sources", headers=AUTH)).json()["sources"]
            down_for, metrics = await endpoint_back(server, started, client, db, MESSAGES)
    most = most_calls_while_down(down_for, FAILURES, COOLDOWN)
    print(f"{during} calls in {down_for:.1f} s down: {most} at most")
    assert during <= most, during
    assert await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'dead'") == 0
    (hooks,) = listed
    assert hooks["breaker"]["state"] in ("open", "half_open")
    assert hooks["breaker"]["last_error"].startswith("HTTP 503")
    assert (
        'webhook_inbox_breaker_transitions_total{change="opened",destination="",source="hooks"} 1.0'
        in metrics
    )
    assert 'change="closed",destination="",source="hooks"} 1.0' in metrics
    # One notice when it opened (probes that failed reopen it without another).
    notices = [json.loads(r.body) for r in alerts.requests]
    breaker_notices = [n for n in notices if n.get("event") == "breaker_opened"]
    assert len(breaker_notices) == 1, notices
    assert "its circuit is open" in breaker_notices[0]["text"]
    assert breaker_notices[0]["source"] == "hooks"
    assert breaker_notices[0]["error"].startswith("HTTP 503")
    # Every message forwarded once the endpoint was back.
    forwarded = [r.headers["idempotency-key"] for r in server.requests[during:]]
    assert sorted(set(forwarded)) == sorted(f"hooks:m-{i}" for i in range(MESSAGES))


async def test_a_probe_that_fails_gives_its_attempt_back_so_no_message_dies_of_the_outage(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # Issue 63: with max_attempts = 5, two failures to open and a 1 s cool-down, a message
    # was dead 3.6 s into a 10 s outage, its attempts spent by the probes.
    async with scripted_server(*[(503, {})] * 1000) as server:
        forward = breaker_forward(server.url, 2, 1)
        config = {"sources": {"hooks": source(forward=forward, max_attempts=5)}}
        async with worker_for(config) as client:
            started = time.monotonic()
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("only"))
            seen = set()
            # Ten seconds down: two failures open it, then a probe about every second.
            while time.monotonic() < started + 10:
                row = await db.fetchrow("SELECT status, attempts FROM inbox_messages")
                seen.add((row["status"], row["attempts"]))
                await asyncio.sleep(0.05)  # a sample of the state every 50 ms, for 10 s
            during = len(server.requests)
            server.script.clear()  # the endpoint is back
            await wait_until(db, "SELECT status FROM inbox_messages", "processed", timeout=10)
    outcomes = [r["outcome"] for r in await db.fetch("SELECT outcome FROM inbox_attempts")]
    attempts = await db.fetchval("SELECT attempts FROM inbox_messages")
    print(f"{during} calls in 10 s down; {attempts} attempts; {outcomes}; states {sorted(seen)}")
    assert "dead" not in {status for status, _ in seen}
    assert max(n for _, n in seen) <= 3  # the two that opened it, and a probe in flight
    assert during >= 6  # the probes went on through the outage
    assert outcomes.count("processed") == 1
    assert attempts == len(outcomes) <= 3  # no attempt row for the probes given back
