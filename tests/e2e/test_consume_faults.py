"""Broker consumers under faults, real processes against the real RabbitMQ (issue 54): `serve`'s
consumer SIGKILLed mid-stream three times, its broker connection cut, and its PostgreSQL stopped
for 20 s. No message acked without its row, none stored twice, no effect twice; the unacked
ones redelivered and counted as accepted or duplicates."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import psutil
import pytest

from service.core.db import asyncpg_dsn, create_engine
from service.core.migrations import upgrade
from service.core.settings import Settings
from service.serve import child_title
from tests.brokers import broker_url
from tests.e2e.test_isolation import children_titled
from tests.pg import EmbeddedServer
from tests.processing_helpers import create_effects, wait_until
from tests.server import ServerProcess, serve_env
from tests.worker_process import start_worker, stop, wait_listening

pytestmark = pytest.mark.slow

DISTINCT = 3000
KILL_AT = (600, 1400, 2200)  # rows stored when each kill comes


def rabbitmq_toml(url: str, queue: str) -> str:
    return f"""
[sources.orders]
kind = "rabbitmq"
url = "{url}"
queue = "{queue}"
message_id = "/id"
prefetch = 50
handlers = ["tests.handlers:record"]
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2
"""


async def test_a_consumer_killed_three_times_loses_and_repeats_nothing(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    url = broker_url("RABBITMQ_URL")
    queue = f"inbox-test-{uuid.uuid4().hex[:12]}"
    await create_effects(db)
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        try:
            env = serve_env(tmp_path, rabbitmq_toml(url, queue), DATABASE_URL=database_url)
            with ServerProcess(env, tmp_path) as server:
                await wait_listening(db, 1)
                ids = [f"m{i}" for i in range(DISTINCT)] + [f"m{i}" for i in range(0, DISTINCT, 5)]
                for message_id in ids:
                    body = f'{{"id": "{message_id}"}}'.encode()
                    await channel.default_exchange.publish(
                        aio_pika.Message(body, content_type="application/json"),
                        routing_key=queue,
                    )
                killed = []
                for threshold in KILL_AT:
                    await wait_until_at_least(db, threshold)
                    (consumer,) = await consumer_children(server)
                    consumer.send_signal(signal.SIGKILL)
                    killed.append(consumer.pid)
                await wait_until(db, "SELECT count(*) FROM effects", DISTINCT, 120)
                await wait_until(
                    db, "SELECT sum(receive_count) >= $1 FROM inbox_messages", True, 60, len(ids)
                )
                declared = await channel.declare_queue(queue, passive=True)
                left = declared.declaration_result.message_count
        finally:
            await channel.queue_delete(queue)
            await channel.queue_delete(f"{queue}.dead")
    assert len(set(killed)) == len(KILL_AT)
    assert left == 0  # every message acked, none before its row
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == DISTINCT
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == DISTINCT
    received = await db.fetchval("SELECT sum(receive_count) FROM inbox_messages")
    # Each published message counted once, and each redelivered after its commit (the kill
    # between the COMMIT and the ack) once more, as a duplicate.
    print(f"{len(ids)} published, {received} received, {received - len(ids)} redelivered")
    assert received >= len(ids)


async def wait_until_at_least(db: asyncpg.Connection, rows: int, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while await db.fetchval("SELECT count(*) FROM inbox_messages") < rows:
            await asyncio.sleep(0.01)  # a look at the count every 10 ms


async def consumer_children(server: ServerProcess, timeout: float = 30) -> list[psutil.Process]:
    """The supervisor's live consumer child, once (re)started."""
    async with asyncio.timeout(timeout):
        while not (found := children_titled(server, child_title("consumer"))):
            await asyncio.sleep(0.05)
    return found


class CuttableProxy:
    """A TCP proxy to RabbitMQ whose connections the test can cut all at once, as a network
    fault or a broker restart would: each side sees its socket closed."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> CuttableProxy:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        self.cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        pair = {writer, up_writer}
        self.writers |= pair
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self.writers -= pair
            for w in pair:
                w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def cut(self) -> int:
        """Close every proxied connection, both sides; how many there were."""
        cut = list(self.writers)
        for writer in cut:
            writer.transport.abort()
        return len(cut) // 2


def amqp_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def through(url: str, port: int) -> str:
    """`url` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@127.0.0.1:{port}"))


async def publish_steadily(
    channel: aio_pika.abc.AbstractChannel, queue: str, ids: list[str], per_second: float
) -> None:
    for message_id in ids:
        body = f'{{"id": "{message_id}"}}'.encode()
        await channel.default_exchange.publish(
            aio_pika.Message(body, content_type="application/json"), routing_key=queue
        )
        await asyncio.sleep(1 / per_second)


async def test_the_broker_connection_cut_mid_stream_reconnects_and_loses_nothing(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    url = broker_url("RABBITMQ_URL")
    queue = f"inbox-test-{uuid.uuid4().hex[:12]}"
    count = 1500
    ids = [f"m{i}" for i in range(count)]
    await create_effects(db)
    connection = await aio_pika.connect(url)
    async with connection, CuttableProxy(*amqp_port(url)) as proxy:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        try:
            toml = rabbitmq_toml(through(url, proxy.port), queue)
            env = serve_env(tmp_path, toml, DATABASE_URL=database_url)
            with ServerProcess(env, tmp_path):
                await wait_until(
                    db, "SELECT bool_or(connected) FROM inbox_consumers", True, timeout=30
                )
                publishing = asyncio.create_task(publish_steadily(channel, queue, ids, 300))
                await wait_until_at_least(db, 300)
                assert proxy.cut() >= 1
                # The row says so (written at once on the change), then the consumer is back.
                await wait_until(db, "SELECT bool_or(connected) FROM inbox_consumers", False, 10)
                lost = await db.fetchval("SELECT last_error FROM inbox_consumers")
                await wait_until(db, "SELECT bool_or(connected) FROM inbox_consumers", True, 20)
                await publishing
                await wait_until(db, "SELECT count(*) FROM effects", count, 60)
                await wait_until(
                    db, "SELECT sum(receive_count) >= $1 FROM inbox_messages", True, 30, count
                )
                left = await waiting_after_acks(channel, queue)
        finally:
            await channel.queue_delete(queue)
            await channel.queue_delete(f"{queue}.dead")
    assert left == 0
    assert lost is not None  # why it lost the broker
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == count
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == count
    assert await db.fetchval("SELECT count(*) FROM effects") == count


async def waiting_after_acks(
    channel: aio_pika.abc.AbstractChannel, queue: str, timeout: float = 10
) -> int:
    """The queue's ready messages once it has none, or after `timeout`."""
    left = -1
    async with asyncio.timeout(timeout):
        while left != 0:
            declared = await channel.declare_queue(queue, passive=True)
            left = int(declared.declaration_result.message_count or 0)
            await asyncio.sleep(0.1)
    return left


PREFETCH = 10


@pytest.fixture
async def own_server() -> AsyncIterator[EmbeddedServer]:
    """A PostgreSQL of this test's own, migrated, since the test stops it."""
    server = await asyncio.to_thread(EmbeddedServer)
    try:
        engine = create_engine(server.url, Settings(database_url="x"))
        await upgrade(engine)
        await engine.dispose()
        yield server
    finally:
        await asyncio.to_thread(server.close)


async def ready_count(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.message_count or 0)


async def test_postgres_stopped_for_20_s_acks_nothing_then_stores_everything_once(
    own_server: EmbeddedServer, tmp_path: Path
) -> None:
    url = broker_url("RABBITMQ_URL")
    queue = f"inbox-test-{uuid.uuid4().hex[:12]}"
    toml = f"""
[sources.orders]
kind = "rabbitmq"
url = "{url}"
queue = "{queue}"
message_id = "/id"
prefetch = {PREFETCH}
"""
    published = 0

    async def publish(n: int) -> None:
        nonlocal published
        for _ in range(n):
            body = f'{{"id": "m{published}"}}'.encode()
            # Publisher confirms: the broker holds it once this returns.
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
            published += 1

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        consumer = start_worker(own_server.url, toml, tmp_path, "consume", command="consume")
        db = await asyncpg.connect(asyncpg_dsn(own_server.url))
        try:
            await wait_until(db, "SELECT bool_or(connected) FROM inbox_consumers", True, 30)
            for _ in range(20):  # 100 a second, for a second
                await publish(5)
                await asyncio.sleep(0.05)
            await wait_until(db, "SELECT count(*) FROM inbox_messages", published, 20)
            await db.close()

            await asyncio.to_thread(own_server.stop)
            down_at = datetime.now(UTC)
            # The consumer takes `prefetch` messages, then the broker sends no more.
            for _ in range(10):
                await publish(2)
                await asyncio.sleep(0.1)
            ready_then, published_then = await ready_count(channel, queue), published
            assert ready_then > 0
            seen = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                await publish(2)
                ready = await ready_count(channel, queue)
                seen.append(ready)
                # Nothing acked: every message published since is still ready, none taken.
                assert ready - ready_then == published - published_then, seen
                await asyncio.sleep(0.1)
            assert consumer.poll() is None, "the consumer must wait out the outage"
            await asyncio.to_thread(own_server.start)

            db = await asyncpg.connect(asyncpg_dsn(own_server.url))
            stored_before = await db.fetchval(
                "SELECT count(*) FROM inbox_messages WHERE received_at < $1", down_at
            )
            # On the broker all along: what was not stored, `prefetch` of it unacked.
            assert ready_then + PREFETCH == published_then - stored_before
            await wait_until(db, "SELECT count(*) FROM inbox_messages", published, 40)
            assert await ready_count(channel, queue) == 0
            assert await stop(consumer) == 0
            # Nothing was left unacked (it would be ready again once the consumer closed).
            assert await ready_count(channel, queue) == 0
            assert await db.fetchval("SELECT count(DISTINCT message_id) FROM inbox_messages") == (
                published
            )
            assert await db.fetchval("SELECT count(*) FROM inbox_consumers") == 0
        finally:
            if consumer.poll() is None:
                consumer.kill()
            await db.close()
            await channel.queue_delete(queue)
            await channel.queue_delete(f"{queue}.dead")
