"""Running a worker: its own engine and pool, sized to its concurrency, until told to stop."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping

from service.core.db import create_engine
from service.core.metrics import Metrics
from service.core.settings import Settings
from service.processing.pipeline import Pipeline
from service.sources.config_file import InboxConfig
from service.worker.worker import Worker, WorkerOptions

# Objects allocated, less those freed, before a young collection (CPython's default is 700).
# Each message leaves ORM rows and their states, dataclasses and driver records alive until
# its batch ends: at 700, bench/process's `add` drain ran 630 young collections per 20,000
# messages, each walking whatever of the batch was still alive.
YOUNG_COLLECTION_THRESHOLD = 5000


def settle_collector() -> None:
    """Call once a processing process has loaded its handlers, before its first batch.

    What start-up built (modules, the mapper registry, settings) lives as long as the process:
    frozen, the collector stops walking it at each full collection. And the young generation
    is collected less often, since most of a batch's objects die with the batch. In
    bench/process's `add` drain of 20,000 messages, the worker's collections took 0.72-0.82 s
    of CPU before this and 0.14-0.19 s after, start-up included (docs/benchmarks.md).
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


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

    With `retention`, it also applies retention every hour (SPEC §6).
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
