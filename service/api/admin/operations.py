"""Admin routes over the whole inbox: statistics, the configured sources, pruning."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Query
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.api.admin.consumers import consumer_infos
from service.api.admin.models import (
    Activity,
    ActivityQuery,
    BreakerState,
    DestinationInfo,
    ForwardInfo,
    HandlerInfo,
    MinuteActivity,
    PruneResult,
    RateLimitStats,
    SourceInfo,
    SourceList,
    SourcePause,
    SourceStats,
    Stats,
)
from service.api.state import StateDep
from service.core import flow as rules
from service.core.schema import UNFINISHED
from service.processing.pipeline import gates_of
from service.sources.base import AnySource
from service.sources.brokers import BrokerSource
from service.sources.config import (
    DestinationConfig,
    ForwardConfig,
    RateLimit,
    SourceConfig,
    endpoint_source,
)
from service.sources.config_file import InboxConfig
from service.store import admin as store
from service.store import flow
from service.store.counts import EndedCounts, status_counts
from service.store.errors import translate_errors
from service.store.flow import gate_key
from service.worker.retention import prune

router = APIRouter(tags=["admin: operations"])


@router.get("/stats", response_model=Stats)
async def stats(state: StateDep) -> Stats:
    """Count messages by source and status; show the backlog's age and last hour's attempts.

    The unfinished statuses (pending, retrying, processing) are counted at each call. On a
    large inbox, the count of the others (processed, dead, discarded) is reused for up to ten
    times as long as it took to make.
    """
    stats = await collect_stats(state.engine, state.ended_counts)
    limits = configured_limits(state.inbox)
    if limits:
        stats.rate_limits = await rate_limit_stats(state.engine, limits)
    if any(isinstance(s, BrokerSource) for s in state.inbox.sources.values()):
        stats.consumers = await consumer_infos(state)
    return stats


def configured_limits(inbox: InboxConfig) -> dict[tuple[str, str | None], RateLimit]:
    """Every rate limit configured: each source's (destination None), each destination's,
    each endpoint's (under its source, `outbox:NAME`)."""
    limits: dict[tuple[str, str | None], RateLimit] = {}
    for name, source in sorted(inbox.sources.items()):
        if source.config.rate_limit is not None:
            limits[(name, None)] = source.config.rate_limit
        for destination, config in source.config.destinations.items():
            if config.rate_limit is not None:
                limits[(name, destination)] = config.rate_limit
    for name, endpoint in sorted(inbox.endpoints.items()):
        if endpoint.rate_limit is not None:
            limits[(endpoint_source(name), None)] = endpoint.rate_limit
    return limits


# Attempts started in the last 10 s: of each source's messages, and of each destination's
# part of them (`source/destination`, the key its bucket has too).
RECENT_STARTS = text(
    """
    WITH recent AS (
        SELECT m.source, a.message_id, a.attempt, a.destination
          FROM inbox_attempts AS a JOIN inbox_messages AS m ON m.id = a.message_id
         WHERE a.started_at > now() - interval '10 seconds' AND m.source = ANY(:sources)
    )
    SELECT source AS key, count(DISTINCT (message_id, attempt)) AS n FROM recent GROUP BY 1
     UNION ALL
    SELECT source || '/' || destination, count(*) FROM recent
     WHERE destination IS NOT NULL GROUP BY 1
    """
)


async def rate_limit_stats(
    engine: AsyncEngine, limits: Mapping[tuple[str, str | None], RateLimit]
) -> list[RateLimitStats]:
    """Each rate limit's current rate (attempts started in the last 10 s) and its shared
    bucket as it stands now (`core.flow.tokens_now`, on the database's clock); the sources'
    first, then their destinations'."""
    names = {"sources": sorted({source for source, _ in limits})}
    async with translate_errors(), engine.connect() as conn:
        recent = {r.key: int(r.n) for r in await conn.execute(RECENT_STARTS, names)}
    gates = await flow.snapshot(engine)
    found = []
    ordered = sorted(limits.items(), key=lambda item: (item[0][1] is not None, item[0]))
    for (name, destination), limit in ordered:
        key = gate_key(name, destination)
        configured = gates_of(limit, None)
        tokens = rules.tokens_now(configured, gates.buckets.get(key), gates.now)
        found.append(
            RateLimitStats(
                source=name,
                destination=destination,
                rate_limit=limit.text,
                per_second=limit.per_second,
                current_per_second=recent.get(key, 0) / 10,
                tokens=round(tokens, 3),
                wait_seconds=round(rules.token_wait(configured, tokens), 3),
            )
        )
    return found


async def collect_stats(engine: AsyncEngine, ended: EndedCounts | None = None) -> Stats:
    """The statistics document (the command line's `stats` shows it too); the ended
    messages come from `ended` when given (see `service.store.counts`)."""
    groups = await status_counts(engine, ended)
    attempts, failures, admin_actions = await store.recent_attempts(engine)
    by_status: dict[str, int] = dict.fromkeys(store.STATUSES, 0)
    per_source: dict[str, SourceStats] = {}
    for group in groups:
        by_status[group.status] = by_status.get(group.status, 0) + group.count
        entry = per_source.setdefault(
            group.source,
            SourceStats(source=group.source, counts={}, total=0, oldest_pending_age_seconds=None),
        )
        entry.counts[group.status] = group.count
        entry.total += group.count
        if group.status in UNFINISHED:
            entry.oldest_pending_age_seconds = max(
                entry.oldest_pending_age_seconds or 0.0, group.oldest_age_seconds
            )
    ages = [s.oldest_pending_age_seconds for s in per_source.values()]
    known = [a for a in ages if a is not None]
    catch_up = await store.catch_up(engine, sum(by_status.get(s, 0) for s in UNFINISHED))
    return Stats(
        total=sum(by_status.values()),
        by_status=by_status,
        sources=[per_source[name] for name in sorted(per_source)],
        oldest_pending_age_seconds=max(known) if known else None,
        attempts_last_hour=attempts,
        failures_last_hour=failures,
        admin_actions_last_hour=admin_actions,
        **catch_up.published(),
    )


@router.get("/stats/activity", response_model=Activity)
async def activity(state: StateDep, query: Annotated[ActivityQuery, Query()]) -> Activity:
    """Count messages received and attempts succeeded or failed, per minute, recently."""
    minutes = await store.activity_per_minute(state.engine, query.minutes)
    return Activity(minutes=[MinuteActivity.model_validate(asdict(m)) for m in minutes])


def without_password(url: str) -> str:
    """`url` with any password in its user-info replaced, fit to show an operator."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()


def handler_infos(config: SourceConfig | DestinationConfig) -> list[HandlerInfo]:
    handlers = [HandlerInfo(target=t, event_types=["*"]) for t in config.handlers]
    return handlers + [
        HandlerInfo(target=h.target, event_types=list(h.event_types)) for h in config.handler
    ]


def forward_info(forward: ForwardConfig | None) -> ForwardInfo | None:
    if forward is None:
        return None
    return ForwardInfo(url=without_password(forward.url), timeout_seconds=forward.timeout_seconds)


def describe(source: AnySource) -> SourceInfo:
    config = source.config
    destinations = [
        DestinationInfo(
            name=name,
            event_types=list(d.event_types),
            payload_filter=d.payload is not None,
            handlers=handler_infos(d),
            forward=forward_info(d.forward),
            rate_limit=d.rate_limit.text if d.rate_limit else None,
        )
        for name, d in config.destinations.items()
    ]
    return SourceInfo(
        name=source.name,
        kind=source.kind,
        mode=config.mode,
        max_attempts=config.max_attempts,
        handlers=handler_infos(config),
        forward=forward_info(config.forward),
        destinations=destinations,
        redelivery_days=source.redelivery_days,
        rate_limit=config.rate_limit.text if config.rate_limit else None,
        ordering_key=config.ordering_key,
    )


@router.get("/sources", response_model=SourceList)
async def sources(state: StateDep) -> SourceList:
    """List the configured sources: kind, mode, handlers, forward URL, destinations, rate
    limit, ordering key, whether paused, breaker; never a secret."""
    paused = await flow.pauses(state.engine)
    gates = await flow.snapshot(state.engine)
    return SourceList(
        sources=[
            describe(s).model_copy(
                update={
                    "paused": SourcePause.model_validate(paused[name]) if name in paused else None,
                    "breaker": breaker_view(gates, name),
                }
            )
            for name, s in sorted(state.inbox.sources.items())
        ]
    )


def breaker_view(
    gates: flow.Snapshot, source: str, destination: str | None = None
) -> BreakerState | None:
    """A forward's breaker as every process sees it (`core.flow.breaker_state`, on the
    database's clock); None for a gate that has never been asked."""
    breaker = gates.breakers.get(gate_key(source, destination))
    if breaker is None:
        return None
    return BreakerState(
        state=rules.breaker_state(breaker, gates.now).value,
        failures=breaker.failures,
        open_until=breaker.open_until,
        opened_at=breaker.opened_at,
        last_error=breaker.last_error,
    )


@router.post("/prune", response_model=PruneResult)
async def prune_now(state: StateDep) -> PruneResult:
    """Apply retention now and report what was deleted."""
    report = await prune(state.engine, state.inbox, metrics=state.metrics)
    return PruneResult(deleted=report.total, by_status=report.by_status, by_source=report.by_source)
