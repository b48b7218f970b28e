"""bench/consume's brokers, each through its own async client: fill a queue, drain it with
plain acks (the baseline), count what is left on it, and the `[sources.bench]` table that
consumes it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import aio_pika
import nats
import nats.js
import nats.js.errors
import orjson
import redis.asyncio
from nats.js.api import AckPolicy, ConsumerConfig


@dataclass
class Drained:
    """A baseline drain: the ids taken, and the seconds from its first ack to its last."""

    ids: list[str]
    seconds: float
    cpu_seconds: float


class Broker(ABC):
    """One broker, as bench/consume uses it; `key` names a queue (stream) of one cell."""

    name: str
    variable: str
    default_url: str

    @property
    def url(self) -> str:
        return os.environ.get(self.variable, self.default_url)

    @abstractmethod
    async def fill(self, key: str, bodies: list[bytes]) -> None:
        """A fresh, empty queue `key` holding `bodies`, in order."""

    @abstractmethod
    async def drain(self, key: str, count: int, prefetch: int) -> Drained:
        """Take `count` messages from `key`, `prefetch` unacked at most, each acked as it comes
        (no confirmation awaited beyond what the client's plain ack does)."""

    @abstractmethod
    async def left(self, key: str) -> int:
        """Messages on `key` not acked (none may be held by a consumer when this is asked)."""

    @abstractmethod
    async def remove(self, key: str) -> None:
        """Delete `key` and the dead letters a consumer may have made beside it."""

    @abstractmethod
    def source_table(self, key: str, prefetch: int) -> str:
        """The TOML keys of a source of this kind reading `key`, ids at `/id` in the body."""


def body_id(body: bytes) -> str:
    """The producer's id in a body, where the consumer's `message_id = "/id"` finds it."""
    found: str = orjson.loads(body)["id"]
    return found


class RabbitMQ(Broker):
    name = "rabbitmq"
    variable = "RABBITMQ_URL"
    default_url = "amqp://guest:guest@127.0.0.1:5672/"

    async def fill(self, key: str, bodies: list[bytes]) -> None:
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=False)
            await channel.queue_delete(key)
            await channel.declare_queue(key, durable=True)
            for body in bodies:
                await channel.default_exchange.publish(
                    aio_pika.Message(
                        body,
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=key,
                )
            # Publishes are not confirmed: wait until the queue holds them all.
            deadline = time.monotonic() + 120
            while await self._ready(channel, key) < len(bodies):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"RabbitMQ holds fewer than {len(bodies)} on {key}")
                await asyncio.sleep(0.05)

    async def drain(self, key: str, count: int, prefetch: int) -> Drained:
        ids: list[str] = []
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=prefetch)
            queue = await channel.declare_queue(key, durable=True)
            cpu = time.process_time()
            first = last = 0.0
            async with queue.iterator() as incoming:
                async for message in incoming:
                    ids.append(body_id(message.body))
                    await message.ack()
                    last = time.perf_counter()
                    if len(ids) == 1:
                        first = last
                    if len(ids) == count:
                        break
            cpu = time.process_time() - cpu
        return Drained(ids, last - first, cpu)

    async def left(self, key: str) -> int:
        connection = await aio_pika.connect(self.url)
        async with connection:
            return await self._ready(await connection.channel(), key)

    async def remove(self, key: str) -> None:
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel()
            for doomed in (key, f"{key}.dead"):
                await channel.queue_delete(doomed)

    def source_table(self, key: str, prefetch: int) -> str:
        return f'kind = "rabbitmq"\nurl = "{self.url}"\nqueue = "{key}"\nprefetch = {prefetch}\n'

    @staticmethod
    async def _ready(channel: aio_pika.abc.AbstractChannel, key: str) -> int:
        declared = await channel.declare_queue(key, passive=True)
        return int(declared.declaration_result.message_count or 0)


class Nats(Broker):
    """A JetStream stream named `key` capturing the subject `bench.KEY`; the baseline reads it
    through a durable pull consumer of its own, each fetch for what `prefetch` leaves room
    for, each message acked with nats-py's plain (unconfirmed) `ack`."""

    name = "nats"
    variable = "NATS_URL"
    default_url = "nats://127.0.0.1:4222"

    async def fill(self, key: str, bodies: list[bytes]) -> None:
        connection = await nats.connect(self.url)
        try:
            js = connection.jetstream()
            await self._delete(js, key)
            await js.add_stream(name=key, subjects=[f"bench.{key}"])
            # Core publishes, which the stream captures, without awaiting a PubAck each;
            # then wait until the stream holds them all.
            for body in bodies:
                await connection.publish(f"bench.{key}", body)
            await connection.flush()
            deadline = time.monotonic() + 120
            while (await js.stream_info(key)).state.messages < len(bodies):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream holds fewer than {len(bodies)} on {key}")
                await asyncio.sleep(0.05)
        finally:
            await connection.close()

    async def drain(self, key: str, count: int, prefetch: int) -> Drained:
        ids: list[str] = []
        connection = await nats.connect(self.url)
        try:
            js = connection.jetstream()
            config = ConsumerConfig(
                durable_name="bench",
                ack_policy=AckPolicy.EXPLICIT,
                max_ack_pending=prefetch,
            )
            await js.add_consumer(key, config)
            subscription = await js.pull_subscribe_bind(durable="bench", stream=key)
            cpu = time.process_time()
            first = last = 0.0
            while len(ids) < count:
                batch = min(prefetch, count - len(ids))
                for msg in await subscription.fetch(batch, timeout=10):
                    ids.append(body_id(msg.data))
                    await msg.ack()
                    last = time.perf_counter()
                    if len(ids) == 1:
                        first = last
            await connection.flush()
            cpu = time.process_time() - cpu
        finally:
            await connection.close()
        return Drained(ids, last - first, cpu)

    async def left(self, key: str) -> int:
        """What any consumer of the stream has not acked: JetStream keeps acked messages (the
        stream's retention is by limits), so each consumer's pending and unacked."""
        connection = await nats.connect(self.url)
        try:
            consumers = await connection.jetstream().consumers_info(key)
            return sum((c.num_pending or 0) + (c.num_ack_pending or 0) for c in consumers)
        finally:
            await connection.close()

    async def remove(self, key: str) -> None:
        connection = await nats.connect(self.url)
        try:
            js = connection.jetstream()
            for doomed in (key, f"{key}_DEAD"):
                await self._delete(js, doomed)
        finally:
            await connection.close()

    @staticmethod
    async def _delete(js: nats.js.JetStreamContext, stream: str) -> None:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)

    def source_table(self, key: str, prefetch: int) -> str:
        return (
            f'kind = "nats"\nurl = "{self.url}"\nstream = "{key}"\n'
            f'subject = "bench.{key}"\nprefetch = {prefetch}\n'
        )


class RedisStreams(Broker):
    """A stream `key` of entries `body=...`; the baseline reads it through a consumer group
    of its own, `prefetch` entries an XREADGROUP, and XACKs each entry on its own."""

    name = "redis-streams"
    variable = "REDIS_URL"
    default_url = "redis://127.0.0.1:6379/0"

    async def fill(self, key: str, bodies: list[bytes]) -> None:
        client = redis.asyncio.from_url(self.url)
        async with client:
            await client.delete(key, f"{key}:dead")
            for start in range(0, len(bodies), 1000):
                async with client.pipeline(transaction=False) as pipe:
                    for body in bodies[start : start + 1000]:
                        pipe.xadd(key, {"body": body, "content-type": "application/json"})
                    await pipe.execute()

    async def drain(self, key: str, count: int, prefetch: int) -> Drained:
        ids: list[str] = []
        client = redis.asyncio.from_url(self.url)
        async with client:
            await client.xgroup_create(key, "bench", id="0")
            cpu = time.process_time()
            first = last = 0.0
            while len(ids) < count:
                # RESP2's shape: [(stream, [(entry id, fields), ...])].
                replies: Any = await client.xreadgroup(
                    "bench", "baseline", {key: ">"}, count=prefetch, block=1000
                )
                for _, entries in replies:
                    for entry_id, fields in entries:
                        ids.append(body_id(fields[b"body"]))
                        await client.xack(key, "bench", entry_id)
                        last = time.perf_counter()
                        if len(ids) == 1:
                            first = last
            cpu = time.process_time() - cpu
        return Drained(ids, last - first, cpu)

    async def left(self, key: str) -> int:
        """Each group's entries not yet read (its lag) and read but not acked (pending)."""
        client = redis.asyncio.from_url(self.url)
        async with client:
            groups = await client.xinfo_groups(key)
            return sum(int(g["pending"]) + int(g["lag"] or 0) for g in groups)

    async def remove(self, key: str) -> None:
        client = redis.asyncio.from_url(self.url)
        async with client:
            await client.delete(key, f"{key}:dead")

    def source_table(self, key: str, prefetch: int) -> str:
        return (
            f'kind = "redis-streams"\nurl = "{self.url}"\nstream = "{key}"\nprefetch = {prefetch}\n'
        )


BROKERS: dict[str, type[Broker]] = {
    "rabbitmq": RabbitMQ,
    "nats": Nats,
    "redis-streams": RedisStreams,
}
