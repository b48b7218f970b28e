"""Flow control per named destination (issue 52 items 2 and 4): a forward destination that is
down for a minute costs at most `breaker_failures` attempts and one per probe, holds none of
the source's other destinations, sends nothing to the dead letters, and gets everything once
it is back; a destination's rate limit holds its own runs only, spending no attempt."""

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
    insert_messages,
    most_calls_while_down,
    source,
    wait_until,
)

FAILURES, COOLDOWN, OUTAGE = 3, 5.0, 60.0
MESSAGES = 20  # the case: 20 messages, max_attempts = 3, down for 60 s
LEDGER = {"handlers": ["tests.handlers:record_billing"]}


async def pairs(db: asyncpg.Connection, destination: str) -> list[tuple[str, int]]:
    rows = await db.fetch(
        "SELECT status, attempts FROM inbox_destinations WHERE destination = $1 ORDER BY 1, 2",
        destination,
    )
    return [(r["status"], r["attempts"]) for r in rows]


async def test_a_destination_down_for_a_minute_costs_n_attempts_and_the_probes(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with scripted_server(*[(503, {})] * 10_000) as crm, scripted_server() as alerts:
        forward = breaker_forward(crm.url, FAILURES, COOLDOWN)
        hooks = source(destinations={"crm": {"forward": forward}, "ledger": LEDGER})
        hooks["max_attempts"] = 3  # the outage alone would exhaust these, attempts spent
        config = {"sources": {"hooks": hooks}, "alerts": {"webhooks": [alerts.url]}}
        async with worker_for(config, admin_tokens=[TOKEN], worker_alerts=True) as client:
            started = time.monotonic()
            for i in range(MESSAGES):
                await client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"m-{i}"))
            # The ledger is not held by the crm's outage: its effects apply at once.
            await wait_until(db, "SELECT count(*) FROM effects", MESSAGES)
            assert time.monotonic() - started < 10
            await asyncio.sleep(OUTAGE - (time.monotonic() - started))
            during = len(crm.requests)
            attempts_during = sum(n for _, n in await pairs(db, "crm"))
            listed = (await client.get("/admin/destinations", headers=AUTH)).json()
            stats = await db.fetch("SELECT status, attempts FROM inbox_messages")
            down_for, metrics = await endpoint_back(crm, started, client, db, MESSAGES)
    most = most_calls_while_down(down_for, FAILURES, COOLDOWN)
    print(f"{during} calls, {attempts_during} attempts in {down_for:.1f} s down")
    assert during <= most, during
    assert attempts_during <= most, attempts_during
    # Nothing dead because of the outage, and no message's attempts ran out waiting.
    assert {r["status"] for r in stats} <= {"retrying", "pending"}
    assert max(r["attempts"] for r in stats) < 3
    assert await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'dead'") == 0
    by_name = {d["destination"]: d for d in listed["destinations"]}
    assert by_name["crm"]["breaker"]["state"] in ("open", "half_open")
    assert by_name["crm"]["breaker"]["last_error"].startswith("HTTP 503")
    assert by_name["ledger"]["breaker"] is None
    assert by_name["ledger"]["counts"] == {"processed": MESSAGES}
    assert (
        'webhook_inbox_breaker_transitions_total{change="opened",destination="crm",'
        'source="hooks"} 1.0' in metrics
    )
    assert 'change="closed",destination="crm",source="hooks"} 1.0' in metrics
    # One notice when it opened, naming the destination.
    notices = [json.loads(r.body)["text"] for r in alerts.requests]
    breaker_notices = [n for n in notices if "its circuit is open" in n]
    assert len(breaker_notices) == 1, notices
    assert "destination `crm` of source `hooks`" in breaker_notices[0]
    # Every message forwarded to the crm once it was back, each once; the ledger's once each.
    forwarded = [r.headers["idempotency-key"] for r in crm.requests[during:]]
    assert sorted(forwarded) == sorted(f"hooks:m-{i}:crm" for i in range(MESSAGES))
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == MESSAGES
    assert await db.fetchval("SELECT count(*) FROM effects") == MESSAGES


RATE, SECONDS = 20, 4.0


async def test_a_destination_rate_limit_holds_its_runs_only_and_spends_no_attempt(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    count = int(RATE * SECONDS)
    async with scripted_server() as crm:
        destinations = {
            "crm": {"forward": {"url": crm.url}, "rate_limit": f"{RATE}/s"},
            "ledger": LEDGER,
        }
        config = {"sources": {"hooks": source(destinations=destinations)}}
        # The backlog at once (not as fast as this machine posts): the crm takes 3 s or more.
        await insert_messages(db, *(f"m-{i}" for i in range(count)))
        async with worker_for(config, admin_tokens=[TOKEN]) as client:
            await wait_until(db, "SELECT count(*) FROM effects", count)
            assert len(crm.requests) < count  # the ledger was not held back with the crm
            stats = (await client.get("/admin/stats", headers=AUTH)).json()
            await wait_until(
                db,
                "SELECT count(*) FROM inbox_destinations "
                "WHERE destination = 'crm' AND status = 'processed'",
                count,
                timeout=SECONDS * 4,
            )
            metrics = (await client.get("/metrics")).text
    times = [r.at for r in crm.requests]
    span = times[-1] - times[0]
    # The first second's burst, then RATE a second: (count - burst) calls over the span.
    rate = (count - RATE) / span
    print(f"crm ran at {rate:.1f}/s against {RATE}/s")
    # Never above the limit; below it only by what a loaded machine's wake-ups slip (15.4/s
    # was seen at a load average of 8).
    assert RATE * 0.7 <= rate <= RATE * 1.2, rate
    # Waiting spent nothing: each pair ran once, one attempt row each, none of them failed.
    assert await pairs(db, "crm") == [("processed", 1)] * count
    attempts = await db.fetch("SELECT outcome, destination FROM inbox_attempts")
    assert sorted((r["destination"], r["outcome"]) for r in attempts) == sorted(
        [("crm", "processed")] * count + [("ledger", "processed")] * count
    )
    (limit,) = stats["rate_limits"]
    assert (limit["source"], limit["destination"], limit["rate_limit"]) == (
        "hooks",
        "crm",
        f"{RATE}/s",
    )
    assert limit["current_per_second"] > 0
    assert 'webhook_inbox_rate_limit_claimed_total{destination="crm",source="hooks"}' in metrics


async def test_a_destination_spends_its_own_attempts_not_the_messages(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    """While its endpoint defers it (503 with Retry-After, no attempt spent) the ledger fails
    and spends the message's attempts; the crm then gets its own three, not what is left."""
    deferrals = [(503, {"Retry-After": "1"})] * 2
    async with scripted_server(*deferrals, *[(500, {})] * 3) as crm:
        destinations = {
            "crm": {"forward": {"url": crm.url}},
            "ledger": {"handlers": ["tests.handlers:always_fail"]},
        }
        config = {"sources": {"hooks": source(destinations=destinations, max_attempts=3)}}
        async with worker_for(config, admin_tokens=[TOKEN]) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
            await wait_until(
                db, "SELECT count(*) FROM inbox_messages WHERE status = 'dead'", 1, timeout=30
            )
            assert await pairs(db, "ledger") == [("dead", 3)]
            assert await pairs(db, "crm") == [("dead", 3)]
            # An operator's retry of the crm gives it a fresh budget: it runs, and succeeds.
            message = await db.fetchval("SELECT id FROM inbox_messages")
            retried = await client.post(
                f"/admin/messages/{message}/destinations/crm/retry", headers=AUTH
            )
            assert retried.status_code == 200, retried.text
            await wait_until(
                db,
                "SELECT status FROM inbox_destinations WHERE destination = 'crm'",
                "processed",
            )
            shown = (await client.get(f"/admin/messages/{message}", headers=AUTH)).json()
    assert [r.status for r in crm.requests] == [503, 503, 500, 500, 500, 200]
    crm_shown = next(d for d in shown["destinations"] if d["name"] == "crm")
    assert (crm_shown["attempt_count"], crm_shown["attempt_count_total"]) == (1, 4)
    crm_attempts = await db.fetch(
        "SELECT outcome FROM inbox_attempts WHERE destination = 'crm' ORDER BY id"
    )
    assert [r["outcome"] for r in crm_attempts] == [
        "failed",
        "failed",
        "dead",
        "admin_retry",
        "processed",
    ]
