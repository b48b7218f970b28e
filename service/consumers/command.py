"""`webhook-inbox consume`, alone or as a consumer child of `serve`: a consumer for each broker
source, each message recorded through ingest's group commit and acked after its commit, until
SIGTERM; then each consumer stops taking messages and settles those it holds."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Callable, Mapping

from service.commands.outcome import CommandError, Exit
from service.consumers.base import BrokerClient
from service.core.settings import ConfigError
from service.sources.base import AnySource
from service.sources.brokers import EXTRAS, BrokerSource
from service.startup import load
from service.worker_command import ready_to_run, run_on_fast_loop

log = logging.getLogger("service.consumers")

# Each broker kind's client, imported only where a source of the kind is configured.
CLIENTS = {
    "rabbitmq": "service.consumers.rabbitmq:RabbitMQClient",
    "nats": "service.consumers.nats:NatsClient",
    "redis-streams": "service.consumers.redis_streams:RedisStreamsClient",
}


def broker_sources(sources: Mapping[str, AnySource]) -> list[BrokerSource]:
    return [s for s in sources.values() if isinstance(s, BrokerSource)]


def client_factories(
    sources: list[BrokerSource],
) -> dict[str, Callable[[BrokerSource], BrokerClient]]:
    """Each configured broker kind's client class; a kind whose client library is not
    installed is a one-line `ConfigError` naming the extra to install."""
    found: dict[str, Callable[[BrokerSource], BrokerClient]] = {}
    for source in sources:
        if source.kind in found:
            continue
        library, extra = EXTRAS[source.kind]
        try:
            importlib.import_module(library)
        except ImportError:
            raise ConfigError(
                f"sources.{source.name}: kind {source.kind!r} needs the {library} package: "
                f"install webhook-inbox[{extra}]"
            ) from None
        module, _, name = CLIENTS[source.kind].partition(":")
        found[source.kind] = getattr(importlib.import_module(module), name)
    return found


def run_consume_command() -> None:
    """`webhook-inbox consume` until SIGTERM or SIGINT. Raises `CommandError` when no broker
    source is configured or the database has no inbox tables."""
    from service.core.collector import settle_collector
    from service.core.db import create_engine, database_url, describe_url
    from service.core.metrics import Metrics
    from service.store.group_commit import ingest_committer

    settings, inbox, pipelines = load(role="consumer")
    sources = broker_sources(inbox.sources)
    if not sources:
        raise CommandError(
            "no broker source is configured (kind rabbitmq, nats or redis-streams)", Exit.USAGE
        )
    try:
        factories = client_factories(sources)
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    url = database_url(settings)
    log.info("database", extra={"url": describe_url(url)})
    settle_collector()

    async def run() -> None:
        from service.consumers.reporting import ConsumerReporter
        from service.consumers.runner import SourceConsumer

        stop = await ready_to_run(settings, url)
        metrics = Metrics(sources=inbox.row_sources)
        engine = create_engine(url, settings)
        committer = ingest_committer(engine, settings, metrics)
        committer.start()
        consumers = [
            SourceConsumer(
                source,
                factories[source.kind],
                committer,
                stop,
                has_work=pipelines[source.name].has_work,
                searchable=pipelines[source.name].search_payload,
                max_body_bytes=settings.max_body_bytes,
                metrics=metrics,
            )
            for source in sources
        ]
        reporter = ConsumerReporter(engine, consumers, stop)
        reporting = asyncio.create_task(reporter.run())
        log.info("consuming", extra={"sources": [s.name for s in sources]})
        try:
            await asyncio.gather(*(c.run() for c in consumers))
        finally:
            reporting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporting
            await reporter.forget()
            await committer.close()
            await engine.dispose()
        log.info("stopped")

    run_on_fast_loop(run())
