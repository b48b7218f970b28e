"""A `redis-streams` source against the machine's real Redis: every distinct id stored once and
every entry acked, an entry without an id, too large or without a body dead-lettered with why,
the entries a killed consumer took claimed by the next one, and a released entry read again
before new ones."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from functools import partial

import asyncpg
import pytest
import redis.asyncio

from service.consumers.redis_streams import REASON_FIELD, RedisStreamsClient
from tests.brokers import broker_source, broker_url, consuming
from tests.conftest import AppFactory
from tests.processing_helpers import wait_until

RECEIVED = "SELECT count(*), coalesce(sum(receive_count), 0) FROM inbox_messages"
GROUP = "webhook-inbox"


@pytest.fixture
async def client() -> AsyncIterator[redis.asyncio.Redis]:
    connection = redis.asyncio.from_url(broker_url("REDIS_URL"), protocol=2)
    try:
        yield connection
    finally:
        await connection.aclose()


@pytest.fixture
async def stream(client: redis.asyncio.Redis) -> AsyncIterator[str]:
    """A stream of this test's own (its group made by the consumer), and its dead letters,
    deleted after it."""
    name = f"inbox-test-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        await client.delete(name, f"{name}:dead")


def redis_streams(stream: str, **extra: object) -> dict[str, object]:
    url = broker_url("REDIS_URL")
    return {"kind": "redis-streams", "url": url, "stream": stream, **extra}


async def add(client: redis.asyncio.Redis, stream: str, entries: list[dict[str, bytes]]) -> None:
    async with client.pipeline(transaction=False) as pipe:
        for fields in entries:
            pipe.xadd(stream, dict(fields))
        await pipe.execute()


async def pending(client: redis.asyncio.Redis, stream: str) -> int:
    """Entries the group delivered and no consumer acked."""
    return int((await client.xpending(stream, GROUP))["pending"])


async def test_ten_thousand_with_a_fifth_duplicates_store_each_id_once_and_ack_all(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    client: redis.asyncio.Redis,
    stream: str,
) -> None:
    distinct = 8_000
    ids = [f"m{i}" for i in range(distinct)] + [f"m{i}" for i in range(0, distinct, 4)]
    # Added before the group exists: it is made from id 0, so these are consumed too.
    await add(client, stream, [{"body": f'{{"id": "{m}"}}'.encode()} for m in ids])
    table = redis_streams(
        stream, prefetch=200, message_id="/id", handlers=["tests.handlers:record"]
    )
    source = broker_source("orders", table)
    async with (
        worker_for({"sources": {"orders": table}}),
        consuming(database_url, source, RedisStreamsClient) as consumer,
    ):
        await wait_until(db, "SELECT count(*) FROM effects", distinct, 300)
        await wait_until(db, "SELECT sum(receive_count) FROM inbox_messages", len(ids), 30)
    assert await pending(client, stream) == 0
    assert tuple(await db.fetchrow(RECEIVED)) == (distinct, len(ids))
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == distinct
    assert consumer.status.counts == {"accepted": distinct, "duplicate": len(ids) - distinct}


async def test_no_id_too_large_or_no_body_is_dead_lettered_with_why_and_nothing_is_stored(
    db: asyncpg.Connection, database_url: str, client: redis.asyncio.Redis, stream: str
) -> None:
    big = b'{"id": "big", "pad": "' + b"x" * 5000 + b'"}'
    await add(
        client,
        stream,
        [
            {"body": b'{"no": "id"}', "producer": b"a"},
            {"body": big, "producer": b"b"},
            {"payload": b'{"id": "elsewhere"}', "producer": b"c"},
            {"body": b'{"id": "ok"}', "content-type": b"application/json", "producer": b"d"},
        ],
    )
    source = broker_source("orders", redis_streams(stream, message_id="/id"))
    async with consuming(database_url, source, RedisStreamsClient, max_body_bytes=4096):
        await wait_until(db, "SELECT count(*) FROM inbox_messages", 1, 20)
        async with asyncio.timeout(20):
            while await client.xlen(f"{stream}:dead") < 3:
                await asyncio.sleep(0.05)  # Redis's count, polled
    dead = await client.xrange(f"{stream}:dead")
    reasons = {fields[b"producer"]: fields[REASON_FIELD].decode() for _, fields in dead}
    assert reasons == {
        b"a": "missing message id: expected the JSON field /id",
        b"b": f"the body is {len(big)} bytes, over the 4096-byte limit",
        b"c": "the entry has no body field (its fields: payload, producer)",
    }
    # The original fields are kept beside the reason.
    assert {fields.get(b"body") for _, fields in dead} == {b'{"no": "id"}', big, None}
    row = await db.fetchrow("SELECT message_id, content_type, headers FROM inbox_messages")
    assert row["message_id"] == "ok"
    assert row["content_type"] == "application/json"
    assert "producer" in row["headers"]
    assert await pending(client, stream) == 0


async def test_entries_a_killed_consumer_took_are_claimed_and_recorded_by_the_next(
    db: asyncpg.Connection, database_url: str, client: redis.asyncio.Redis, stream: str
) -> None:
    distinct = 1000
    await add(client, stream, [{"body": f'{{"id": "m{i}"}}'.encode()} for i in range(distinct)])
    table = redis_streams(stream, prefetch=200, message_id="/id", claim_idle_seconds=0.5)
    source = broker_source("orders", table)
    # The first consumer takes 200 entries, hands out 150, settles none and dies: its
    # connection is closed with the entries still pending under its name.
    killed = RedisStreamsClient(source, consumer="killed-1")
    await killed.connect()
    taken = killed.messages()
    for _ in range(150):
        await anext(taken)
    await taken.aclose()
    await killed.close()
    assert await pending(client, stream) == 200
    live = partial(RedisStreamsClient, consumer="live-2")
    async with consuming(database_url, source, live, has_work=False) as consumer:
        await wait_until(db, "SELECT count(*) FROM inbox_messages", distinct, 30)
        async with asyncio.timeout(10):
            while await pending(client, stream):
                await asyncio.sleep(0.05)
    assert tuple(await db.fetchrow(RECEIVED)) == (distinct, distinct)
    assert consumer.status.counts == {"accepted": distinct}
    consumers = {c["name"]: c["pending"] for c in await client.xinfo_consumers(stream, GROUP)}
    assert consumers == {b"killed-1": 0, b"live-2": 0}


async def test_a_released_entry_is_read_again_before_new_ones(
    client: redis.asyncio.Redis, stream: str
) -> None:
    await add(client, stream, [{"body": name} for name in (b"a", b"b", b"c")])
    source = broker_source("orders", redis_streams(stream, prefetch=2))
    reader = RedisStreamsClient(source, consumer="only")
    await reader.connect()
    try:
        assert await reader.lag() == 3
        messages = reader.messages()
        first, second = await anext(messages), await anext(messages)
        assert (first.body, second.body) == (b"a", b"b")
        await first.release()
        await second.ack()
        again, third = await anext(messages), await anext(messages)
        assert (again.body, again.broker_id, third.body) == (b"a", first.broker_id, b"c")
        for message in (again, third):
            await message.ack()
        assert await reader.lag() == 0
        assert await pending(client, stream) == 0
        await messages.aclose()
    finally:
        await reader.close()
