"""`GET /metrics`: the Prometheus text exposition of this process and of the inbox table."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from starlette.responses import Response

from service.api.state import StateDep
from service.core.metrics import CONTENT_TYPE, InboxSnapshot
from service.core.schema import UNFINISHED
from service.store.admin import status_counts
from service.store.errors import StoreUnavailable

log = logging.getLogger("service.metrics")

router = APIRouter(tags=["health"])


async def read_snapshot(state: StateDep) -> InboxSnapshot | None:
    """Counts by source and status from one GROUP BY; None (series omitted) if the DB is down."""
    try:
        groups = await status_counts(state.engine)
    except StoreUnavailable as exc:
        log.warning("metrics: database unavailable", extra={"error": str(exc)})
        return None
    ages = [g.oldest_age_seconds for g in groups if g.status in UNFINISHED]
    return InboxSnapshot(
        counts={(g.source, g.status): g.count for g in groups},
        oldest_pending_age_seconds=max(ages) if ages else 0.0,
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format."}},
)
async def metrics(state: StateDep) -> Response:
    """Prometheus metrics: deliveries, ingest latency, messages by status, backlog age, pruning."""
    state.metrics.set_inbox_snapshot(await read_snapshot(state))
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
