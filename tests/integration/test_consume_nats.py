"""A `nats` source against the machine's real NATS JetStream: every distinct id stored once and
every message acked, a message without an id or too large dead-lettered with why, the
`Nats-Msg-Id` header as the broker's id (the stream sequence without one), and the streams the
client creates only when absent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from service.consumers.nats import REASON_HEADER, NatsClient
from tests.brokers import broker_source, broker_url, consuming
from tests.conftest import AppFactory
from tests.processing_helpers import wait_until

RECEIVED = "SELECT count(*), coalesce(sum(receive_count), 0) FROM inbox_messages"


@dataclass
class Stream:
    name: str
    subject: str

    @property
    def dead(self) -> str:
        return f"{self.name}_DEAD"


@pytest.fixture
async def connection() -> AsyncIterator[Client]:
    nc = await nats.connect(broker_url("NATS_URL"))
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
async def stream(connection: Client) -> AsyncIterator[Stream]:
    """A stream name and subject of this test's own; the stream and its dead letters' stream
    (whoever made them) deleted after it."""
    token = uuid.uuid4().hex[:12]
    made = Stream(f"inbox_test_{token}", f"inbox.test.{token}")
    try:
        yield made
    finally:
        js = connection.jetstream()
        for doomed in (made.name, made.dead):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(doomed)


def nats_table(stream: Stream, **extra: object) -> dict[str, object]:
    url = broker_url("NATS_URL")
    return {"kind": "nats", "url": url, "stream": stream.name, "subject": stream.subject, **extra}


async def consumer_counts(js: JetStreamContext, stream: Stream) -> tuple[int, int]:
    """The durable consumer's (num_pending, num_ack_pending): not yet delivered, and delivered
    and not acked."""
    info = await js.consumer_info(stream.name, "webhook-inbox")
    return info.num_pending or 0, info.num_ack_pending or 0


async def test_ten_thousand_with_a_fifth_duplicates_store_each_id_once_and_ack_all(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    connection: Client,
    stream: Stream,
) -> None:
    js = connection.jetstream()
    await js.add_stream(name=stream.name, subjects=[stream.subject])
    distinct = 8_000
    ids = [f"m{i}" for i in range(distinct)] + [f"m{i}" for i in range(0, distinct, 4)]
    # Published without a JetStream ack each (then flushed): the stream keeps every copy,
    # since none carries a Nats-Msg-Id for JetStream's own duplicate window to drop.
    for m in ids:
        await connection.publish(stream.subject, json.dumps({"id": m}).encode())
    await connection.flush()
    assert (await js.stream_info(stream.name)).state.messages == len(ids)
    table = nats_table(stream, message_id="/id", prefetch=200, handlers=["tests.handlers:record"])
    source = broker_source("orders", table)
    async with (
        worker_for({"sources": {"orders": table}}),
        consuming(database_url, source, NatsClient) as consumer,
    ):
        await wait_until(db, "SELECT count(*) FROM effects", distinct, 300)
        await wait_until(db, "SELECT sum(receive_count) FROM inbox_messages", len(ids), 30)
    assert await consumer_counts(js, stream) == (0, 0)
    assert tuple(await db.fetchrow(RECEIVED)) == (distinct, len(ids))
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == distinct
    assert await db.fetchval("SELECT count(*) FROM effects") == distinct
    assert consumer.status.counts == {"accepted": distinct, "duplicate": len(ids) - distinct}


async def test_no_id_or_too_large_is_dead_lettered_with_why_and_nothing_is_stored(
    db: asyncpg.Connection, database_url: str, connection: Client, stream: Stream
) -> None:
    js = connection.jetstream()
    await js.add_stream(name=stream.name, subjects=[stream.subject])
    big = b'{"id": "big", "pad": "' + b"x" * 5000 + b'"}'
    for name, body in (("no-id", b'{"no": "id"}'), ("big", big), ("ok", b'{"id": "ok"}')):
        await js.publish(stream.subject, body, headers={"Test-Name": name})
    source = broker_source("orders", nats_table(stream, message_id="/id"))
    async with consuming(database_url, source, NatsClient, max_body_bytes=4096) as consumer:
        await wait_until(db, "SELECT count(*) FROM inbox_messages", 1, 20)
        async with asyncio.timeout(20):  # the dead letters' stream, made by the client
            while await dead_letters_kept(js, stream) < 2:
                await asyncio.sleep(0.05)
    dead = await js.pull_subscribe(f"{stream.subject}.dead", stream=stream.dead)
    reasons = {}
    for message in await dead.fetch(2, timeout=5):
        assert message.headers is not None
        reasons[message.headers["Test-Name"]] = message.headers[REASON_HEADER]
    assert reasons == {
        "no-id": "missing message id: expected the JSON field /id",
        "big": f"the body is {len(big)} bytes, over the 4096-byte limit",
    }
    assert await db.fetchval("SELECT message_id FROM inbox_messages") == "ok"
    assert await consumer_counts(js, stream) == (0, 0)
    assert consumer.status.counts == {"accepted": 1, "dead_lettered": 2}


async def dead_letters_kept(js: JetStreamContext, stream: Stream) -> int:
    try:
        return (await js.stream_info(stream.dead)).state.messages
    except nats.js.errors.NotFoundError:
        return 0


async def test_the_broker_id_is_nats_msg_id_else_the_stream_sequence(
    db: asyncpg.Connection, database_url: str, connection: Client, stream: Stream
) -> None:
    js = connection.jetstream()
    # JetStream drops a Nats-Msg-Id it saw within the window itself; past it, a producer's
    # republish is stored again, and only the inbox sees the two as one message.
    await js.add_stream(name=stream.name, subjects=[stream.subject], duplicate_window=0.2)
    order = {"Nats-Msg-Id": "order-1", "Content-Type": "application/json"}
    await js.publish(stream.subject, b'{"n": 1}', headers=dict(order))
    await asyncio.sleep(0.5)
    await js.publish(stream.subject, b'{"n": 1}', headers=dict(order))
    await js.publish(stream.subject, b'{"n": 2}')
    assert (await js.stream_info(stream.name)).state.messages == 3
    source = broker_source("orders", nats_table(stream, message_id="broker"))
    async with consuming(database_url, source, NatsClient, has_work=False) as consumer:
        await wait_until(db, "SELECT sum(receive_count) FROM inbox_messages", 3, 20)
    rows = await db.fetch(
        "SELECT message_id, receive_count, content_type FROM inbox_messages ORDER BY message_id"
    )
    assert [tuple(r) for r in rows] == [
        (f"{stream.name}:3", 1, None),
        ("order-1", 2, "application/json"),
    ]
    assert consumer.status.counts == {"accepted": 2, "duplicate": 1}
    assert await consumer_counts(js, stream) == (0, 0)


async def test_an_absent_stream_is_created_for_the_subject_and_its_dead_letters_beside_it(
    connection: Client, stream: Stream
) -> None:
    client = NatsClient(broker_source("orders", nats_table(stream)))
    await client.connect()
    try:
        assert await client.lag() == 0
    finally:
        await client.close()
    js = connection.jetstream()
    assert (await js.stream_info(stream.name)).config.subjects == [stream.subject]
    assert (await js.stream_info(stream.dead)).config.subjects == [f"{stream.subject}.dead"]


async def test_an_existing_stream_is_used_as_it_is(connection: Client, stream: Stream) -> None:
    js = connection.jetstream()
    # The operator's stream keeps the dead letters too: no stream of the client's is made.
    await js.add_stream(name=stream.name, subjects=[f"{stream.subject}.>", stream.subject])
    client = NatsClient(broker_source("orders", nats_table(stream)))
    await client.connect()
    await client.close()
    assert (await js.stream_info(stream.name)).config.subjects == [
        f"{stream.subject}.>",
        stream.subject,
    ]
    assert await dead_letters_kept(js, stream) == 0
    with pytest.raises(nats.js.errors.NotFoundError):
        await js.stream_info(stream.dead)


class Cuttable:
    """A TCP relay to NATS whose connections the test can cut, as a broker going away does."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition("/")[2].rpartition(":")
        self.target = (host, int(port))
        self.links: list[asyncio.StreamWriter] = []

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        self.links += [writer, upstream_writer]
        await asyncio.gather(
            self._relay(reader, upstream_writer), self._relay(upstream_reader, writer)
        )

    def cut(self) -> None:
        for writer in self.links:
            writer.transport.abort()
        self.links.clear()


async def test_a_lost_connection_ends_the_fetch_and_the_consumer_reconnects(
    db: asyncpg.Connection, database_url: str, connection: Client, stream: Stream
) -> None:
    relay = Cuttable(broker_url("NATS_URL"))
    listener = await asyncio.start_server(relay.accept, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    table = {**nats_table(stream, message_id="/id"), "url": f"nats://127.0.0.1:{port}"}
    js = connection.jetstream()
    async with listener, consuming(database_url, broker_source("orders", table), NatsClient) as c:
        async with asyncio.timeout(10):
            while not c.status.connected:
                await asyncio.sleep(0.05)
        relay.cut()
        async with asyncio.timeout(10):  # not nats-py's reconnecting: the runner's, reported
            while c.status.last_error is None:
                await asyncio.sleep(0.01)
        lost = c.status.last_error
        await js.publish(stream.subject, b'{"id": "after"}')
        await wait_until(db, "SELECT count(*) FROM inbox_messages", 1, 20)
        assert c.status.connected
    assert lost == "ConnectionClosedError: nats: connection closed"
