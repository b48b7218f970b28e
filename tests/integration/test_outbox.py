"""The outbox (issue 65): outgoing messages staged in a transaction are sent once it commits,
never when it rolls back, signed with Standard Webhooks and a stable key, and held (not dead)
while their endpoint is down."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session
from sqlmodel.ext.asyncio.session import AsyncSession
from standardwebhooks.webhooks import Webhook

from service import outbox
from tests.conftest import AppFactory
from tests.http_server import Received, ScriptedServer, scripted_server
from tests.processing_helpers import (
    delivery,
    endpoint_back,
    most_calls_while_down,
    source,
    wait_until,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OUTGOING = "SELECT status, attempts, message_id FROM inbox_messages WHERE source = 'outbox:crm'"
SENT = "SELECT status FROM inbox_messages WHERE source = 'outbox:crm'"
DEAD = "SELECT count(*) FROM inbox_messages WHERE status = 'dead'"
PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"


def with_crm(url: str, *handlers: str, **endpoint: object) -> dict[str, object]:
    crm = {"url": url, "secret": SECRET, "timeout_seconds": 2, **endpoint}
    return {
        "sources": {"hooks": source(*handlers, max_attempts=3)},
        "endpoints": {"crm": {**crm, "backoff_base_seconds": 0.05, "backoff_max_seconds": 0.2}},
    }


async def wait_until_requests(server: ScriptedServer, count: int, timeout: float) -> None:
    """Until `server` has received `count` requests, or fail after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while len(server.requests) < count:
            server.arrived.clear()
            await server.arrived.wait()


def verified(request: Received) -> object:
    """The request's body, verified as any Standard Webhooks receiver verifies it."""
    return Webhook(SECRET).verify(request.body, request.headers)


async def test_a_handler_that_stages_and_fails_sends_nothing_and_its_retry_sends_once(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with scripted_server() as crm:
        config = with_crm(crm.url, "tests.handlers:stage_then_fail_first")
        async with worker_for(config) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("c1"))
            await wait_until(db, SENT, "processed", 10)
            metrics = (await client.get("/metrics")).text
            failed = await db.fetch(
                "SELECT outcome, error FROM inbox_attempts a JOIN inbox_messages m "
                "ON m.id = a.message_id WHERE m.source = 'hooks' ORDER BY a.id"
            )
    assert [(a["outcome"], a["error"]) for a in failed] == [
        ("failed", "failing after staging"),
        ("processed", None),
    ]
    # The failed attempt's message was rolled back with its effects: one request, once.
    (request,) = crm.requests
    assert verified(request) == {"type": "customer.synced", "id": "c1"}
    assert request.headers["idempotency-key"] == "hooks:c1:1"
    assert request.headers["webhook-id"] == "hooks:c1:1"
    assert request.headers["content-type"] == "application/json"
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
    assert [tuple(r) for r in await db.fetch(OUTGOING)] == [("processed", 1, "hooks:c1:1")]
    # The endpoint's series, under its source.
    sent = 'webhook_inbox_attempts_total{outcome="processed",source="outbox:crm"} 1.0'
    assert sent in metrics
    assert 'webhook_inbox_messages{source="outbox:crm",status="processed"} 1.0' in metrics
    assert 'webhook_inbox_dead_letters{source="outbox:crm"} 0.0' in metrics


async def test_an_unknown_endpoint_fails_the_attempt_at_the_call(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with scripted_server() as crm:
        config = with_crm(crm.url, "tests.handlers:stage_to_unknown_endpoint")
        async with worker_for(config) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("u1"))
            await wait_until(db, "SELECT status FROM inbox_messages", "dead", 10)
    error = await db.fetchval("SELECT last_error FROM inbox_messages")
    assert error == "ValueError: no endpoint named 'nowhere' (configured: crm)"
    assert crm.requests == []


async def test_an_application_transaction_that_rolls_back_sends_nothing(
    worker_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    async_engine = create_async_engine(
        database_url.replace("postgresql://", "postgresql+asyncpg://")
    )
    sync_engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    async with scripted_server() as crm, worker_for(with_crm(crm.url)):
        try:
            # The user's own async app (a SQLModel AsyncSession): one rolled back, one kept.
            async with AsyncSession(async_engine) as session:
                await outbox.send_async(session, "crm", {"n": 1}, key="rolled-back")
                await session.rollback()
                key = await outbox.send_async(session, "crm", {"n": 2}, event_type="order.paid")
                await session.commit()
            # And a sync SQLAlchemy Session, as a sync FastAPI route has.
            with Session(sync_engine) as sync_session:
                outbox.send(sync_session, "crm", "plain text", key="sync-kept")
                sync_session.commit()
                outbox.send(sync_session, "crm", b"{}", key="sync-rolled-back")
                sync_session.rollback()
        finally:
            await async_engine.dispose()
            sync_engine.dispose()
        await wait_until(
            db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 2, 10
        )
    sent = {r.headers["idempotency-key"]: r for r in crm.requests}
    assert sorted(sent) == sorted([key, "sync-kept"])
    assert key.startswith("out_")
    assert verified(sent[key]) == {"n": 2}
    assert sent["sync-kept"].body == b"plain text"
    assert sent["sync-kept"].headers["content-type"] == "text/plain; charset=utf-8"
    rows = await db.fetch("SELECT message_id, event_type FROM inbox_messages ORDER BY id")
    assert [tuple(r) for r in rows] == [(key, "order.paid"), ("sync-kept", None)]


async def test_a_key_staged_again_is_sent_once(
    worker_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    async with scripted_server() as crm, worker_for(with_crm(crm.url)):
        try:
            for n in range(2):
                async with engine.begin() as conn:
                    await outbox.send_async(
                        conn, "crm", {"n": n}, key="same", headers={"X-Tenant": "acme"}
                    )
        finally:
            await engine.dispose()
        await wait_until(db, SENT, "processed", 10)
    (request,) = crm.requests
    assert json.loads(request.body) == {"n": 0}
    assert request.headers["x-tenant"] == "acme"


async def test_an_endpoint_down_holds_its_messages_none_dead_and_sends_them_after(
    worker_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    failures, cooldown, messages = 2, 1.0, 8
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    async with scripted_server(*[(503, {})] * 1000) as crm:
        # Two attempts each: were the outage to spend them, every message would be dead.
        config = with_crm(
            crm.url,
            breaker_failures=failures,
            breaker_cooldown_seconds=cooldown,
            max_attempts=2,
        )
        async with worker_for(config) as client:
            started = time.monotonic()
            try:
                async with engine.begin() as conn:
                    for n in range(messages):
                        await outbox.send_async(conn, "crm", {"n": n}, key=f"k{n}")
            finally:
                await engine.dispose()
            # The breaker opens after two failures; three probes fail a cool-down apart.
            await wait_until_requests(crm, failures + 3, 15)
            assert await db.fetchval(DEAD) == 0
            during = len(crm.requests)
            down_for, _ = await endpoint_back(crm, started, client, db, messages)
    assert during <= most_calls_while_down(down_for, failures, cooldown), during
    assert await db.fetchval(DEAD) == 0
    delivered = {r.headers["webhook-id"] for r in crm.requests if r.status == 200}
    assert delivered == {f"k{n}" for n in range(messages)}


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"endpoint": "Bad Name"}, "'Bad Name' is not an endpoint name"),
        ({"key": "has space"}, "printable ASCII characters without spaces"),
        ({"key": "x" * 256}, "1-255 printable ASCII"),
        ({"headers": {"Idempotency-Key": "x"}}, "the relay sets the idempotency-key header"),
        ({"headers": {"bad name": "x"}}, "is not an HTTP header name"),
        ({"headers": {"x-a": "line\nbreak"}}, "a value is printable ASCII"),
        ({"payload": b"\xff\xfe"}, "must be UTF-8 text"),
        ({"payload": {1, 2}}, "JSON-serialisable"),
        ({"event_type": ""}, "an event type is 1-256"),
    ],
)
def test_a_bad_argument_is_refused_before_anything_is_staged(
    arguments: dict[str, object], error: str
) -> None:
    given: dict[str, object] = {"endpoint": "crm", "payload": {"id": 1}, "event_type": None}
    given.update({"key": None, "headers": None} | arguments)
    with pytest.raises(ValueError, match=error):
        outbox.stage_values(
            given.pop("endpoint"),  # type: ignore[arg-type]
            given.pop("payload"),
            **given,  # type: ignore[arg-type]
        )


def test_a_derived_key_is_the_message_and_the_position_or_its_hash() -> None:
    assert outbox.derived_key("hooks", "evt_1", None, 2) == "hooks:evt_1:2"
    assert outbox.derived_key("hooks", "evt_1", "crm", 1) == "hooks:evt_1:crm:1"
    hashed = outbox.derived_key("hooks", "commande n° 1", None, 1)
    assert hashed.startswith("sha256:")
    assert len(hashed) == 71
    assert hashed == outbox.derived_key("hooks", "commande n° 1", None, 1)


async def test_an_endpoints_retry_after_and_rate_limit_hold_its_messages_without_an_attempt(
    worker_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    # One attempt each: were the 429 or the rate limit to spend it, the message would be dead.
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    async with scripted_server((429, {"Retry-After": "1"})) as crm:
        config = with_crm(crm.url, max_attempts=1, rate_limit="4/s")
        async with worker_for(config):
            try:
                async with engine.begin() as conn:
                    for n in range(6):
                        await outbox.send_async(conn, "crm", {"n": n}, key=f"r{n}")
            finally:
                await engine.dispose()
            await wait_until(db, f"{PROCESSED} AND source = 'outbox:crm'", 6, 15)
    assert await db.fetchval(DEAD) == 0
    assert await db.fetchval("SELECT max(attempts) FROM inbox_messages") == 1
    sent = sorted(r.at for r in crm.requests if r.status == 200)
    # Six at 4/s with a burst of four: the last two wait a token each.
    assert sent[-1] - sent[0] >= 0.4, sent
    first = crm.requests[0]
    again = [r for r in crm.requests if r.headers["webhook-id"] == first.headers["webhook-id"]]
    assert again[1].at - first.at >= 1.0  # the 429's Retry-After, no attempt spent


async def test_a_body_that_cannot_be_signed_is_dead_at_once_naming_why(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # `service.outbox` refuses such a payload; a row staged by hand reaches the relay.
    async with scripted_server() as crm, worker_for(with_crm(crm.url)):
        await db.execute(
            "INSERT INTO inbox_messages (source, message_id, body) "
            "VALUES ('outbox:crm', 'binary', '\\xfffe'::bytea)"
        )
        await db.execute("NOTIFY webhook_inbox")
        await wait_until(db, SENT, "dead", 10)
    assert crm.requests == []
    assert await db.fetchval("SELECT last_error FROM inbox_messages") == (
        "ForwardRejected: the body is not UTF-8 text, which a Standard Webhooks signature needs"
    )
