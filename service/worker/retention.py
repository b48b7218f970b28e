"""Retention: which rows may go (age, status, each source's redelivery floor), and pruning them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.metrics import Metrics
from service.core.schema import Status
from service.sources.config import endpoint_source
from service.sources.config_file import InboxConfig, unconfigured_source_floor_days
from service.store.errors import StoreUnavailable
from service.store.retention import delete_batch

log = logging.getLogger("service.worker.retention")

PRUNE_BATCH_SIZE = 1000
PRUNE_INTERVAL_SECONDS = 3600.0

FINISHED = (Status.PROCESSED, Status.DISCARDED)


@dataclass(frozen=True)
class Rule:
    """Delete `statuses` rows of one source (None: any unconfigured one) older than `keep_days`,
    and never within `floor_days` of their last receipt."""

    source: str | None
    statuses: tuple[str, ...]
    keep_days: float
    floor_days: float


def retention_rules(inbox: InboxConfig) -> list[Rule]:
    """The rules `[retention]` and the sources' redelivery floors give."""
    retention = inbox.retention
    # A source removed from the config still has rows; its kind is unknown, so the longest
    # floor of any kind protects them.
    targets: list[tuple[str | None, float]] = [
        (name, source.redelivery_days) for name, source in inbox.sources.items()
    ]
    # An endpoint's outgoing messages keep their keys `keep_keys_days`: staging one again
    # within it sends nothing twice (docs/outbox.md#retention).
    targets += [
        (endpoint_source(name), endpoint.keep_keys_days)
        for name, endpoint in inbox.endpoints.items()
    ]
    targets.append((None, unconfigured_source_floor_days()))
    rules = []
    for name, floor in targets:
        rules.append(Rule(name, FINISHED, max(retention.processed_days, floor), floor))
        if retention.dead_days is not None:
            rules.append(Rule(name, (Status.DEAD,), max(retention.dead_days, floor), floor))
    return rules


@dataclass
class PruneReport:
    """What one pruning pass deleted."""

    by_status: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


async def prune(
    engine: AsyncEngine,
    inbox: InboxConfig,
    *,
    batch_size: int = PRUNE_BATCH_SIZE,
    metrics: Metrics | None = None,
) -> PruneReport:
    """Apply retention now, batch by batch, until nothing eligible is left; report the deletions."""
    report = PruneReport()
    statuses: Counter[str] = Counter()
    configured = inbox.row_sources
    for rule in retention_rules(inbox):
        while True:
            deleted = await delete_batch(
                engine,
                statuses=rule.statuses,
                keep_days=rule.keep_days,
                floor_days=rule.floor_days,
                batch=batch_size,
                source=rule.source,
                configured=configured,
            )
            if deleted:
                statuses.update(deleted)
                label = rule.source if rule.source is not None else "(unconfigured)"
                report.by_source[label] = report.by_source.get(label, 0) + len(deleted)
                if metrics is not None:
                    metrics.pruned(Counter(deleted))
            if len(deleted) < batch_size:
                break
            await asyncio.sleep(0)  # let ingest's requests run between batches
    report.by_status = {status: statuses.get(status, 0) for status in (*FINISHED, Status.DEAD)}
    log.info("pruned", extra={"deleted": report.total, **report.by_status})
    return report


async def prune_periodically(
    engine: AsyncEngine,
    inbox: InboxConfig,
    stop: asyncio.Event,
    *,
    interval_seconds: float = PRUNE_INTERVAL_SECONDS,
    metrics: Metrics | None = None,
) -> None:
    """For the worker: prune now, then every `interval_seconds`, until `stop` is set.

    A database outage skips a pass (logged); any other error propagates so that the worker's
    supervisor sees a side task die.
    """
    while not stop.is_set():
        try:
            await prune(engine, inbox, metrics=metrics)
        except StoreUnavailable as exc:
            log.warning("prune skipped: database unavailable", extra={"error": str(exc)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_seconds)
