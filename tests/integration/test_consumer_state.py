"""Each broker consumer's row in `inbox_consumers`, written by the consumer against the real
RabbitMQ and read by readyz, `GET /admin/consumers`, `/admin/stats` and `/metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import aio_pika
import asyncpg
import pytest

from service.consumers.rabbitmq import RabbitMQClient
from service.consumers.reporting import ConsumerReporter, process_name
from service.core.db import create_engine
from service.core.settings import Settings
from tests.admin_seed import AUTH, TOKEN
from tests.brokers import broker_source, broker_url, consuming
from tests.conftest import AppFactory
from tests.processing_helpers import wait_until


@pytest.fixture
async def queue() -> AsyncIterator[str]:
    name = f"inbox-test-{uuid.uuid4().hex[:12]}"
    connection = await aio_pika.connect(broker_url("RABBITMQ_URL"))
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True)
        for n in range(3):
            body = f'{{"id": "m{n}"}}'.encode()
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=name)
        try:
            yield name
        finally:
            await queue.delete(if_unused=False, if_empty=False)
            await channel.queue_delete(f"{name}.dead")


async def test_readyz_admin_and_metrics_follow_the_consumers_rows(
    client_for: AppFactory, db: asyncpg.Connection, database_url: str, queue: str
) -> None:
    table = {"kind": "rabbitmq", "url": broker_url("RABBITMQ_URL"), "queue": queue}
    orders = {**table, "message_id": "/id", "handlers": ["tests.handlers:record"]}
    config = {"sources": {"orders": orders}}
    async with client_for(config, admin_tokens=[TOKEN]) as client:
        before = await client.get("/readyz")
        assert before.status_code == 503
        assert before.json()["detail"].startswith("no consumer of broker source orders is")

        source = broker_source("orders", {**table, "prefetch": 1, "message_id": "/id"})
        engine = create_engine(database_url, Settings(database_url=database_url))
        stop = asyncio.Event()
        async with consuming(database_url, source, RabbitMQClient) as consumer:
            reporter = ConsumerReporter(engine, [consumer], stop)
            reporting = asyncio.create_task(reporter.run())
            await wait_until(
                db, "SELECT count(*) FROM inbox_consumers WHERE connected", 1, timeout=20
            )
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["consumers"] == {"orders": 1}

            listed = (await client.get("/admin/consumers", headers=AUTH)).json()["consumers"]
            (row,) = listed
            assert row["source"] == "orders"
            assert row["consumer"] == process_name()
            assert (row["connected"], row["state"], row["stale"]) == (True, "connected", False)
            stats = (await client.get("/admin/stats", headers=AUTH)).json()
            assert [c["source"] for c in stats["consumers"]] == ["orders"]

            await wait_until(db, "SELECT count(*) FROM inbox_messages", 3, timeout=20)
            await wait_until(db, "SELECT lag FROM inbox_consumers", 0, timeout=20)
            metrics = (await client.get("/metrics")).text
            assert 'webhook_inbox_consumer_lag{source="orders"} 0.0' in metrics

            # A row not written for 15 s: the process died without its clean stop.
            stop.set()
            await reporting
            await db.execute("UPDATE inbox_consumers SET updated_at = now() - interval '16 s'")
            stale = await client.get("/readyz")
            assert stale.status_code == 503
            listed = (await client.get("/admin/consumers", headers=AUTH)).json()["consumers"]
            assert [r["stale"] for r in listed] == [True]
            await reporter.forget()
        assert await db.fetchval("SELECT count(*) FROM inbox_consumers") == 0
        with contextlib.suppress(Exception):
            await engine.dispose()
