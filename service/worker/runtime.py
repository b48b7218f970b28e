"""Running a worker: its own engine and pool, sized to its concurrency, until told to stop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from service.core.db import create_engine
from service.core.metrics import Metrics
from service.core.settings import Settings
from service.processing.pipeline import Pipeline
from service.sources.config_file import InboxConfig
from service.worker.base import WorkerOptions
from service.worker.worker import Worker


async def run_worker(
    settings: Settings,
    url: str,
    pipelines: Mapping[str, Pipeline],
    stop: asyncio.Event,
    *,
    metrics: Metrics | None = None,
    retention: InboxConfig | None = None,
) -> None:
    """Run a worker on `url` until `stop` is set (raises `WorkerCrashed` if a part of it dies).

    With `retention`, it also applies retention every hour (docs/operating.md#retention).
    """
    options = WorkerOptions.from_settings(settings)
    # Its own pool, so that HTTP ingest in the same process never waits behind batches. Two
    # connections a claim loop: a batch's transaction commits its claims on a second one while
    # it holds the first, and with fewer a loop would wait for that second one, holding its
    # transaction (and its rows' locks) open meanwhile. One more for the poller. No pre-ping:
    # it costs a round trip per batch, and a batch on a dead connection is retried.
    engine = create_engine(
        url, settings, pool_size=2 * options.concurrency + 1, pool_pre_ping=False
    )
    try:
        worker = Worker(engine, url, pipelines, options, metrics=metrics, retention=retention)
        await worker.run(stop)
    finally:
        await engine.dispose()
