"""RabbitMQ (aio-pika): a durable queue consumed with manual acks and a prefetch; a message
that cannot be recorded is published to the dead-letter queue (publisher-confirmed) and only
then acked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from service.consumers.base import BrokerClient, BrokerMessage
from service.sources.brokers import BrokerSource, RabbitMQSource

REASON_HEADER = "x-inbox-dead-letter-reason"


def _text_headers(headers: dict[str, Any] | None) -> dict[str, str]:
    """AMQP header values (bytes, numbers, tables) as the text the inbox stores."""
    found: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        found[str(name)] = str(value)
    return found


@dataclass
class RabbitMQMessage(BrokerMessage):
    incoming: AbstractIncomingMessage | None = None
    channel: AbstractChannel | None = None
    dead_letter_queue: str = ""

    async def ack(self) -> None:
        assert self.incoming is not None
        await self.incoming.ack()

    async def release(self) -> None:
        assert self.incoming is not None
        await self.incoming.nack(requeue=True)

    async def dead_letter(self, reason: str) -> None:
        assert self.incoming is not None
        assert self.channel is not None
        incoming = self.incoming
        moved = aio_pika.Message(
            incoming.body,
            headers={**(incoming.headers or {}), REASON_HEADER: reason},
            content_type=incoming.content_type,
            message_id=incoming.message_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        # The channel confirms publishes: this returns once the broker holds the copy.
        await self.channel.default_exchange.publish(moved, routing_key=self.dead_letter_queue)
        await incoming.ack()


class RabbitMQClient(BrokerClient):
    def __init__(self, source: BrokerSource) -> None:
        assert isinstance(source, RabbitMQSource)
        self.source = source
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.channel: AbstractChannel | None = None
        self.queue: AbstractQueue | None = None

    async def connect(self) -> None:
        self.connection = await aio_pika.connect(self.source.url, timeout=10)
        channel = self.channel = await self.connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=self.source.config.prefetch)
        self.queue = await channel.declare_queue(self.source.config.queue, durable=True)
        await channel.declare_queue(self.source.dead_letter_queue, durable=True)

    async def messages(self) -> AsyncIterator[BrokerMessage]:
        assert self.queue is not None
        assert self.channel is not None
        async with self.queue.iterator() as incoming:
            async for message in incoming:
                yield RabbitMQMessage(
                    message.body,
                    _text_headers(message.headers),
                    message.message_id,
                    message.content_type,
                    incoming=message,
                    channel=self.channel,
                    dead_letter_queue=self.source.dead_letter_queue,
                )
        raise ConnectionError("the queue's consumer was cancelled")

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()

    async def lag(self) -> int | None:
        if self.channel is None:
            return None
        declared = await self.channel.declare_queue(self.source.config.queue, passive=True)
        count = declared.declaration_result.message_count
        return None if count is None else int(count)
