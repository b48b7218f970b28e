"""What `webhook-inbox worker` runs, alone or as a processing child of `serve`: the worker's
claim loops on uvloop, after a check that the database is migrated."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from service.commands.outcome import not_migrated
from service.startup import load

if TYPE_CHECKING:
    from service.core.settings import Settings

log = logging.getLogger("service.worker_command")


def run_on_fast_loop(main: Coroutine[Any, Any, None]) -> None:
    """`asyncio.run` on uvloop when it is installed (uvicorn[standard] brings it), as the HTTP
    process runs: bench/process found the worker's stdlib loop spending half its time in its
    socket writes to PostgreSQL."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


async def migrated(settings: Settings, url: str) -> bool:
    """False when the database answers and has no inbox tables (a worker started before
    `migrate`); True otherwise, unreachable included: the worker then waits for it, as ever."""
    from service.core.db import create_engine
    from service.core.migrations import has_inbox_tables
    from service.store.errors import StoreUnavailable, translate_errors

    engine = create_engine(url, settings, pool_size=1)
    try:
        async with translate_errors():
            return await has_inbox_tables(engine)
    except StoreUnavailable:
        return True
    finally:
        await engine.dispose()


async def ready_to_run(settings: Settings, url: str) -> asyncio.Event:
    """The event SIGTERM or SIGINT sets, once the database is known to be migrated (or
    unreachable, then waited for): how a long-running command (`worker`, `consume`) starts."""
    from service.core.db import describe_url

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if not await migrated(settings, url):
        raise not_migrated(describe_url(url))
    return stop


def run_worker_command(
    *,
    concurrency: int | None = None,
    batch_size: int | None = None,
    poll_seconds: float | None = None,
    grace_seconds: float | None = None,
) -> None:
    """`webhook-inbox worker` until SIGTERM or SIGINT; each option left None is read from the
    environment (INBOX_WORKER_*). Raises `CommandError` when the database has no inbox tables."""
    from service.core.collector import settle_collector
    from service.core.db import database_url, describe_url
    from service.core.metrics import Metrics
    from service.worker.priority import yield_to_ingest
    from service.worker.runtime import run_worker
    from service.worker.worker import WorkerCrashed

    settings, inbox, pipelines = load(
        role="processing",
        worker_concurrency=concurrency,
        worker_batch_size=batch_size,
        worker_poll_seconds=poll_seconds,
        worker_grace_seconds=grace_seconds,
    )
    niceness = yield_to_ingest(settings.worker_nice)
    url = database_url(settings)
    log.info("database", extra={"url": describe_url(url), "niceness": niceness})
    settle_collector()

    async def run() -> None:
        stop = await ready_to_run(settings, url)
        metrics = Metrics(sources=inbox.row_sources)
        await run_worker(settings, url, pipelines, stop, metrics=metrics, retention=inbox)

    try:
        run_on_fast_loop(run())
    except WorkerCrashed as exc:
        log.critical("worker crashed", extra={"error": str(exc)})
        sys.exit(1)
