"""Admin routes of the outbox: each endpoint, its outgoing messages by status, its breaker.

The outgoing messages themselves are listed, retried and discarded by the message routes,
under their endpoint's source (`outbox:NAME`): they are rows of the inbox like any other.
"""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy.ext.asyncio import AsyncEngine

from service.api.admin.models import EndpointInfo, EndpointList, SourcePause
from service.api.admin.operations import breaker_view, without_password
from service.api.state import StateDep
from service.core.schema import UNFINISHED
from service.sources.config import endpoint_source
from service.sources.config_file import InboxConfig
from service.store import flow
from service.store.counts import EndedCounts, status_counts

router = APIRouter(tags=["admin: outbox"])


async def collect_endpoints(
    engine: AsyncEngine, inbox: InboxConfig, ended: EndedCounts | None = None
) -> EndpointList:
    """Each configured endpoint with its messages' counts, its pause and its breaker (the
    command line's `outbox` and the console's Outbox page show the same document)."""
    groups = await status_counts(engine, ended)
    paused = await flow.pauses(engine)
    gates = await flow.snapshot(engine)
    endpoints = []
    for name, endpoint in sorted(inbox.endpoints.items()):
        source = endpoint_source(name)
        mine = [g for g in groups if g.source == source]
        ages = [g.oldest_age_seconds for g in mine if g.status in UNFINISHED]
        endpoints.append(
            EndpointInfo(
                name=name,
                source=source,
                url=without_password(endpoint.url),
                timeout_seconds=endpoint.timeout_seconds,
                signed=endpoint.secret is not None,
                max_attempts=endpoint.max_attempts,
                rate_limit=endpoint.rate_limit.text if endpoint.rate_limit else None,
                keep_keys_days=endpoint.keep_keys_days,
                counts={g.status: g.count for g in mine if g.count},
                total=sum(g.count for g in mine),
                oldest_pending_age_seconds=max(ages) if ages else None,
                paused=SourcePause.model_validate(paused[source]) if source in paused else None,
                breaker=breaker_view(gates, source),
            )
        )
    return EndpointList(endpoints=endpoints)


@router.get("/outbox", response_model=EndpointList)
async def endpoints(state: StateDep) -> EndpointList:
    """List the outbox's endpoints: URL, signing, retry policy, their outgoing messages by
    status and the oldest unsent one's age, pause and breaker; never a secret."""
    return await collect_endpoints(state.engine, state.inbox, state.ended_counts)
