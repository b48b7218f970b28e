"""The broker tests' brokers: each test reads its URL from the environment (RABBITMQ_URL,
NATS_URL, REDIS_URL; `.ci/run` sets all three) and is skipped, naming the variable, without
it; and a consumer run in this process against the test database."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from service.consumers.base import BrokerClient
from service.consumers.runner import SourceConsumer
from service.core.db import create_engine
from service.core.settings import Settings
from service.sources.brokers import BrokerSource
from service.sources.config_file import parse_inbox_config
from service.store.group_commit import GroupCommitter

EXAMPLES = {
    "RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:5672/",
    "NATS_URL": "nats://127.0.0.1:4222",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
}


def broker_url(variable: str) -> str:
    """The broker's URL from `variable`, or skip the test saying what to set."""
    url = os.environ.get(variable)
    if not url:
        pytest.skip(f"set {variable} (as in {variable}={EXAMPLES[variable]}) to run this test")
    return url


def broker_source(name: str, table: dict[str, Any]) -> BrokerSource:
    source = parse_inbox_config({"sources": {name: table}}).sources[name]
    assert isinstance(source, BrokerSource)
    return source


@asynccontextmanager
async def consuming(
    database_url: str,
    source: BrokerSource,
    client: Callable[[BrokerSource], BrokerClient],
    *,
    has_work: bool = True,
    max_body_bytes: int = 1024 * 1024,
) -> AsyncIterator[SourceConsumer]:
    """`source`'s consumer running in this event loop, recording into the test database
    through a group commit of its own, until the block ends (then stopped and drained)."""
    engine = create_engine(database_url, Settings(database_url=database_url))
    committer = GroupCommitter(engine)
    committer.start()
    stop = asyncio.Event()
    consumer = SourceConsumer(
        source, client, committer, stop, has_work=has_work, max_body_bytes=max_body_bytes
    )
    task = asyncio.create_task(consumer.run())
    try:
        yield consumer
    finally:
        stop.set()
        await task
        await committer.close()
        await engine.dispose()
