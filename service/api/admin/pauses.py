"""Admin routes that pause and resume a source's processing (ingest goes on accepting)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Body, Path

from service.api.admin.models import SOURCE_PATTERN, PauseRequest, PauseResult, SourcePause
from service.api.problems import ProblemError, problem_responses
from service.api.security import AdminDep
from service.api.state import AppState, StateDep
from service.core import tracing
from service.store import flow as store

log = logging.getLogger("service.admin")

router = APIRouter(tags=["admin: operations"])

SourcePath = Annotated[
    str,
    Path(
        pattern=SOURCE_PATTERN,
        max_length=200,
        description="A configured source, or `outbox:NAME` for an endpoint's outgoing messages.",
    ),
]


def configured(state: AppState, source: str) -> None:
    if source not in state.inbox.row_sources:
        names = ", ".join(sorted(state.inbox.row_sources)) or "none"
        raise ProblemError(404, f"no source {source} is configured (configured: {names})")


@router.post(
    "/sources/{source}/pause", response_model=PauseResult, responses=problem_responses(404)
)
async def pause_source(
    state: StateDep, admin: AdminDep, source: SourcePath, request: Annotated[PauseRequest, Body()]
) -> PauseResult:
    """Pause a source's processing: no worker claims its messages until it is resumed, across
    restarts; ingest goes on accepting and deduplicating its deliveries, which wait as
    `pending` with no attempt spent. A batch already claimed finishes. Pausing a paused source
    replaces its operator and reason."""
    configured(state, source)
    with tracing.admin_span("pause", source=source):
        row = await store.pause_source(
            state.engine, source, request.operator, request.reason, admin.actor
        )
    state.metrics.admin_actions.labels("pause").inc()
    log.info(
        "source paused",
        extra={
            "source": source,
            "operator": request.operator,
            "reason": request.reason,
            "actor": admin.actor,
        },
    )
    return PauseResult(source=source, paused=SourcePause.model_validate(row), changed=True)


@router.post(
    "/sources/{source}/resume", response_model=PauseResult, responses=problem_responses(404)
)
async def resume_source(state: StateDep, admin: AdminDep, source: SourcePath) -> PauseResult:
    """Resume a paused source: the workers are woken and claim its messages in their order."""
    configured(state, source)
    with tracing.admin_span("resume", source=source):
        row = await store.resume_source(state.engine, source)
    if row is not None:
        state.metrics.admin_actions.labels("resume").inc()
        log.info("source resumed", extra={"source": source, "actor": admin.actor})
    return PauseResult(source=source, paused=None, changed=row is not None)
