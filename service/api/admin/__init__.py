"""The admin REST API (docs/operating.md#admin-api): inbox state, history, retries, stats."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from service.api.admin import (
    bulk_actions,
    consumers,
    destinations,
    export,
    issues,
    messages,
    operations,
    outbox,
    pauses,
    rejections,
    tail,
)
from service.api.problems import problem_responses
from service.api.security import require_admin

router = APIRouter(
    prefix="/admin",
    dependencies=[Depends(require_admin)],
    responses=problem_responses(400, 401, 422, 503),
)
# Before the messages' routes: `/messages/actions` and `/messages/export` are not message ids.
router.include_router(bulk_actions.router)
router.include_router(export.router)
router.include_router(messages.router)
router.include_router(operations.router)
router.include_router(destinations.router)
router.include_router(outbox.router)
router.include_router(pauses.router)
router.include_router(rejections.router)
router.include_router(tail.router)
router.include_router(consumers.router)
router.include_router(issues.router)

__all__ = ["router"]
