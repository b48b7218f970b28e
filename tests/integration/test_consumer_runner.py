"""The consumer's runner against a broker whose subscription keeps failing: after each failed
subscription it reconnects with its whole prefetch, recording into the real test database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg

from service.consumers.base import BrokerClient, BrokerMessage
from service.sources.brokers import BrokerSource
from tests.brokers import broker_source, consuming
from tests.processing_helpers import wait_until


@dataclass
class Settled:
    acked: list[str] = field(default_factory=list)


@dataclass
class OneMessage(BrokerMessage):
    settled: Settled = field(default_factory=Settled)

    async def ack(self) -> None:
        self.settled.acked.append(str(self.broker_id))

    async def release(self) -> None:
        pass

    async def dead_letter(self, reason: str) -> None:
        raise AssertionError(reason)


class FailingTwiceThenServing(BrokerClient):
    """A broker whose first two subscriptions fail as they start; the third serves three
    messages, then waits."""

    subscriptions = 0
    settled = Settled()

    def __init__(self, source: BrokerSource) -> None:
        self.source = source

    async def connect(self) -> None:
        type(self).subscriptions += 1

    async def messages(self) -> AsyncIterator[BrokerMessage]:
        if type(self).subscriptions <= 2:
            raise ConnectionError("the subscription failed")
        for n in range(3):
            yield OneMessage(b"{}", {}, f"m{n}", "application/json", self.settled)
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass


async def test_a_failed_subscription_gives_back_its_room_for_a_message(
    db: asyncpg.Connection, database_url: str
) -> None:
    # With a prefetch of one, a single room lost to a failed subscription would leave the
    # consumer unable to take any message after it.
    table = {"kind": "rabbitmq", "url": "amqp://127.0.0.1:1/", "queue": "q", "prefetch": 1}
    source = broker_source("orders", table)
    async with consuming(database_url, source, FailingTwiceThenServing, has_work=False):
        await wait_until(db, "SELECT count(*) FROM inbox_messages", 3, 20)
        await wait_until_acked(FailingTwiceThenServing.settled, 3)
    assert FailingTwiceThenServing.subscriptions == 3
    assert FailingTwiceThenServing.settled.acked == ["m0", "m1", "m2"]


async def wait_until_acked(settled: Settled, count: int, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while len(settled.acked) < count:
            await asyncio.sleep(0.01)  # the runner acks right after each commit
