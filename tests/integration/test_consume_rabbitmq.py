"""A `rabbitmq` source against the machine's real RabbitMQ (issue 54): every distinct id stored
once and every message acked, a redelivery counted as a duplicate, a message without an id or
too large dead-lettered with why, and nothing acked before its row commits."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import asyncpg
import pytest

from service.consumers.rabbitmq import REASON_HEADER, RabbitMQClient
from tests.brokers import broker_source, broker_url, consuming
from tests.conftest import AppFactory
from tests.processing_helpers import wait_until

RECEIVED = "SELECT count(*), coalesce(sum(receive_count), 0) FROM inbox_messages"


@pytest.fixture
async def channel() -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(broker_url("RABBITMQ_URL"))
    async with connection:
        yield await connection.channel()


@pytest.fixture
async def queue(channel: aio_pika.abc.AbstractChannel) -> AsyncIterator[str]:
    """A durable queue of this test's own, and its dead letters, deleted after it."""
    name = f"inbox-test-{uuid.uuid4().hex[:12]}"
    await channel.declare_queue(name, durable=True)
    try:
        yield name
    finally:
        for doomed in (name, f"{name}.dead"):
            await channel.queue_delete(doomed)


def rabbitmq(queue: str, **extra: object) -> dict[str, object]:
    url = broker_url("RABBITMQ_URL")
    return {"kind": "rabbitmq", "url": url, "queue": queue, **extra}


async def publish(
    channel: aio_pika.abc.AbstractChannel, queue: str, bodies: list[tuple[str | None, bytes]]
) -> None:
    for message_id, body in bodies:
        await channel.default_exchange.publish(
            aio_pika.Message(body, message_id=message_id, content_type="application/json"),
            routing_key=queue,
        )


async def waiting(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    """Messages on the queue not taken by a consumer (ready), as the broker counts them."""
    declared = await channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.message_count or 0)


async def test_ten_thousand_with_a_fifth_duplicates_store_each_id_once_and_ack_all(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
) -> None:
    # 10,000 published, a fifth of them a second copy of an earlier one.
    distinct = 8_000
    ids = [f"m{i}" for i in range(distinct)] + [f"m{i}" for i in range(0, distinct, 4)]
    bodies = [(m, f'{{"id": "{m}"}}'.encode()) for m in ids]
    await publish(channel, queue, bodies)
    table = rabbitmq(queue, prefetch=200, handlers=["tests.handlers:record"])
    source = broker_source("orders", table)
    async with (
        worker_for({"sources": {"orders": table}}),
        consuming(database_url, source, RabbitMQClient) as consumer,
    ):
        await wait_until(db, "SELECT count(*) FROM effects", distinct, 300)
        await wait_until(db, "SELECT sum(receive_count) FROM inbox_messages", len(ids), 30)
    assert await waiting(channel, queue) == 0
    assert tuple(await db.fetchrow(RECEIVED)) == (distinct, len(ids))
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == distinct
    assert consumer.status.counts == {"accepted": distinct, "duplicate": len(ids) - distinct}


async def test_no_id_or_too_large_is_dead_lettered_with_why_and_nothing_is_stored(
    db: asyncpg.Connection,
    database_url: str,
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
) -> None:
    # The id is the body's `id` (aio-pika gives every message it publishes an AMQP id).
    big = b'{"id": "big", "pad": "' + b"x" * 5000 + b'"}'
    bodies = [("no-id", b'{"no": "id"}'), ("big", big), ("ok", b'{"id": "ok"}')]
    await publish(channel, queue, bodies)
    source = broker_source("orders", rabbitmq(queue, message_id="/id"))
    async with consuming(database_url, source, RabbitMQClient, max_body_bytes=4096):
        await wait_until(db, "SELECT count(*) FROM inbox_messages", 1, 20)
        await wait_until_count(channel, f"{queue}.dead", 2)
    dead = await channel.declare_queue(f"{queue}.dead", passive=True)
    reasons = {}
    for _ in range(2):
        message = await dead.get(timeout=5)
        assert message is not None
        reasons[message.message_id] = str(message.headers[REASON_HEADER])
        await message.ack()
    assert reasons == {
        "no-id": "missing message id: expected the JSON field /id",
        "big": f"the body is {len(big)} bytes, over the 4096-byte limit",
    }
    assert await db.fetchval("SELECT message_id FROM inbox_messages") == "ok"
    assert await waiting(channel, queue) == 0


async def wait_until_count(
    channel: aio_pika.abc.AbstractChannel, queue: str, count: int, timeout: float = 20
) -> None:
    async with asyncio.timeout(timeout):
        while await waiting(channel, queue) < count:
            await asyncio.sleep(0.05)  # the broker's count, polled


async def test_an_http_delivery_to_a_broker_source_is_refused(
    client_for: AppFactory, queue: str
) -> None:
    async with client_for({"sources": {"orders": rabbitmq(queue)}}) as client:
        answer = await client.post("/webhooks/orders", content=b"{}")
    assert answer.status_code == 404
    assert answer.json()["detail"] == (
        "source 'orders' consumes from RabbitMQ; it takes no HTTP deliveries"
    )
