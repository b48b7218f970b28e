"""`GET /metrics`: the Prometheus text exposition of this process and of the inbox table."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from starlette.responses import Response

from service.api.state import StateDep
from service.core.metrics import CONTENT_TYPE, InboxSnapshot
from service.core.schema import UNFINISHED, Status
from service.sources.brokers import BrokerSource
from service.store.admin import catch_up
from service.store.consumers import consumers_by_source
from service.store.counts import status_counts
from service.store.errors import StoreUnavailable
from service.store.issues import issue_counts

log = logging.getLogger("service.metrics")

router = APIRouter(tags=["health"])


# Scrapes within this many seconds of the last one are answered from its snapshot: several
# Prometheus replicas (or a scrape every second) then cost one read, not one each.
SNAPSHOT_CACHE_SECONDS = 2.0


async def read_snapshot(state: StateDep) -> InboxSnapshot | None:
    """Counts by source and status (`service.store.counts`); None (series omitted) if the
    database is down.

    Every gauge derived from the table is read here, at scrape time, by whichever HTTP process
    answers: the database is the one truth every process shares, so under `serve` nothing of
    them goes through the per-process files (no multiprocess_mode to choose, no stale value
    left by a process that died).
    """
    try:
        groups = await status_counts(state.engine, state.ended_counts)
    except StoreUnavailable as exc:
        log.warning("metrics: database unavailable", extra={"error": str(exc)})
        return None
    ages = [g.oldest_age_seconds for g in groups if g.status in UNFINISHED]
    backlog = dict.fromkeys(state.inbox.row_sources, 0.0)
    dead = dict.fromkeys(state.inbox.row_sources, 0)
    for g in groups:
        if g.status in UNFINISHED:
            backlog[g.source] = max(backlog.get(g.source, 0.0), g.oldest_age_seconds)
        elif g.status == Status.DEAD:
            dead[g.source] = g.count
    unfinished = sum(g.count for g in groups if g.status in UNFINISHED)
    try:
        rates = await catch_up(state.engine, unfinished)
        lag = await consumer_lag(state)
        issues, issue_failed_attempts = await issue_counts(state.engine)
    except StoreUnavailable as exc:
        log.warning("metrics: database unavailable", extra={"error": str(exc)})
        return None
    return InboxSnapshot(
        counts={(g.source, g.status): g.count for g in groups},
        oldest_pending_age_seconds=max(ages) if ages else 0.0,
        backlog_age_seconds=backlog,
        dead_letters=dead,
        consumer_lag=lag,
        issues=issues,
        issue_failed_attempts=issue_failed_attempts,
        **rates.published(),
    )


async def consumer_lag(state: StateDep) -> dict[str, int]:
    """Each configured broker source's lag, as its freshest consumer wrote it."""
    brokers = [n for n, s in state.inbox.sources.items() if isinstance(s, BrokerSource)]
    if not brokers:
        return {}
    found = await consumers_by_source(state.engine)
    return {name: lag for name in brokers if name in found and (lag := found[name].lag) is not None}


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format."}},
)
async def metrics(state: StateDep) -> Response:
    """Prometheus metrics: deliveries, latency, messages by status, backlog and its catch-up, dead
    letters."""
    if not state.metrics.snapshot_is_fresh(SNAPSHOT_CACHE_SECONDS):
        state.metrics.set_inbox_snapshot(await read_snapshot(state))
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
