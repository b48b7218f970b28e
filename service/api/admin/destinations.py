"""Admin routes over named destinations: retry, replay and discard one (message, destination)
pair, replay a source's messages to one destination in bulk, and the counts per destination."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Body, Path
from sqlalchemy.ext.asyncio import AsyncEngine

from service.api.admin.messages import MessageIdPath, acted, store_errors, to_filter
from service.api.admin.models import (
    BulkRetryResult,
    DestinationReplayRequest,
    DestinationStats,
    DestinationStatsList,
    MessageFilters,
    RetryRequest,
    RetryResult,
)
from service.api.admin.operations import breaker_view
from service.api.problems import ProblemError, problem_responses
from service.api.security import AdminDep
from service.api.state import StateDep
from service.core import tracing
from service.sources.config import DESTINATION_NAME
from service.sources.config_file import InboxConfig
from service.store import destinations as store
from service.store import flow
from service.store.admin import ADMIN_DISCARD, MessageFilter

log = logging.getLogger("service.admin")

router = APIRouter(tags=["admin: destinations"])

DestinationPath = Annotated[
    str, Path(pattern=DESTINATION_NAME, description="The destination's name.")
]
SourcePath = Annotated[str, Path(pattern=r"^[a-z0-9_-]+$", max_length=200)]


def configured_of(inbox: InboxConfig) -> dict[str, list[str]]:
    """Each source's named destinations, in configuration order."""
    return {name: list(source.config.destinations) for name, source in inbox.sources.items()}


@contextmanager
def destination_errors() -> Iterator[None]:
    """`store_errors`, and an unknown destination as 404."""
    try:
        with store_errors():
            yield
    except store.UnknownDestination as exc:
        raise ProblemError(404, exc.detail) from None


@router.get("/destinations", response_model=DestinationStatsList)
async def destination_stats(state: StateDep) -> DestinationStatsList:
    """(message, destination) pairs by status, per named destination."""
    return await collect_destination_stats(state.engine, configured_of(state.inbox))


async def collect_destination_stats(
    engine: AsyncEngine, known: Mapping[str, Sequence[str]]
) -> DestinationStatsList:
    """The counts of every destination in `known` (each source's), and of any other that has
    pairs stored (the command line shows them too)."""
    counts = await store.destination_counts(engine)
    gates = await flow.snapshot(engine)
    keys = {(source, name) for source, names in known.items() for name in names}
    return DestinationStatsList(
        destinations=[
            DestinationStats(
                source=source,
                destination=name,
                counts=counts.get((source, name), {}),
                total=sum(counts.get((source, name), {}).values()),
                breaker=breaker_view(gates, source, name),
            )
            for source, name in sorted(keys | set(counts))
        ]
    )


@router.post(
    "/messages/{id}/destinations/{name}/retry",
    response_model=RetryResult,
    responses=problem_responses(404, 409),
)
async def retry_destination(
    state: StateDep,
    admin: AdminDep,
    id: MessageIdPath,
    name: DestinationPath,
    request: Annotated[RetryRequest | None, Body()] = None,
) -> RetryResult:
    """Run one destination of a message again, leaving its other destinations as they are: a
    retrying, dead or discarded one gets a fresh attempt budget; a processed one, or one that
    never ran for the message (added to the config since), is replayed with `force`."""
    force = request.force if request is not None else False
    with tracing.admin_span("retry_destination", id=id) as span, destination_errors():
        row, action = await store.retry_destination(
            state.engine, id, name, admin.actor, force, configured_of(state.inbox)
        )
        if span is not None:
            span.set_attribute("inbox.admin.result", action)
    return acted(state, admin, action, row, destination=name)


@router.post(
    "/messages/{id}/destinations/{name}/discard",
    response_model=RetryResult,
    responses=problem_responses(404, 409),
)
async def discard_destination(
    state: StateDep, admin: AdminDep, id: MessageIdPath, name: DestinationPath
) -> RetryResult:
    """Set one destination of a message aside; the message's status is summarised again."""
    with tracing.admin_span("discard_destination", id=id) as span, destination_errors():
        row, changed = await store.discard_destination(
            state.engine, id, name, admin.actor, configured_of(state.inbox)
        )
        if span is not None:
            span.set_attribute("inbox.admin.result", "discarded" if changed else "none")
    return acted(state, admin, ADMIN_DISCARD if changed else "none", row, destination=name)


def replay_filter(source: str, request: DestinationReplayRequest) -> MessageFilter:
    """The messages of `source` that a replay to one of its destinations asks for."""
    return to_filter(
        MessageFilters(
            source=source,
            event_type=request.event_type,
            received_after=request.received_after,
            received_before=request.received_before,
        ),
        list(request.status),
    )


@router.post(
    "/sources/{source}/destinations/{name}/replay",
    response_model=BulkRetryResult,
    responses=problem_responses(404),
)
async def replay_to_destination(
    state: StateDep,
    admin: AdminDep,
    source: SourcePath,
    name: DestinationPath,
    request: Annotated[DestinationReplayRequest, Body()],
) -> BulkRetryResult:
    """Run one destination for the source's messages matching the filters (by default every
    one not in flight): the older messages a destination added later never received. Each
    message's other destinations are left as they are; a message the destination's own filter
    does not pass is recorded as skipped by it. `dry_run` only counts."""
    if name not in configured_of(state.inbox).get(source, []):
        raise ProblemError(404, f"source {source} has no destination {name}")
    with tracing.admin_span("replay_to_destination", dry_run=request.dry_run) as span:
        result = await store.replay_to_destination(
            state.engine,
            replay_filter(source, request),
            name,
            admin.actor,
            dry_run=request.dry_run,
        )
        if span is not None:
            span.set_attribute("inbox.admin.matched", result.matched)
            span.set_attribute("inbox.admin.retried", result.retried)
    for action, count in result.by_action.items():
        if count:
            state.metrics.admin_actions.labels(action).inc(count)
    log.info(
        "replay to destination",
        extra={
            "actor": admin.actor,
            "source": source,
            "destination": name,
            "dry_run": request.dry_run,
            "matched": result.matched,
            "retried": result.retried,
        },
    )
    return BulkRetryResult(matched=result.matched, retried=result.retried)
