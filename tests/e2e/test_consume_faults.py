"""`serve`'s consumer process SIGKILLed mid-stream, three times (issue 54): no message acked
without its row, no effect twice, the unacked ones redelivered and counted as accepted or
duplicates."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import psutil
import pytest

from service.serve import child_title
from tests.brokers import broker_url
from tests.e2e.test_isolation import children_titled
from tests.processing_helpers import create_effects, wait_until
from tests.server import ServerProcess, serve_env
from tests.worker_process import wait_listening

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
