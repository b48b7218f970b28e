"""Admin routes over bulk actions: act on every message a search matches (retry, replay,
discard, replay to one destination) as a recorded, resumable operation, and its audit.

The batches run in a background task of the app (`AppState.background`), which shutdown
cancels: the action is then `interrupted`, to be resumed. The command line and the console
start and resume actions through the functions here, so that each reads its search the same
way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import JSONResponse

from service.api.admin.destinations import configured_of
from service.api.admin.messages import store_errors, to_filter
from service.api.admin.models import (
    MAX_ID,
    BulkActionCount,
    BulkActionDocument,
    BulkActionList,
    BulkActionListQuery,
    BulkActionRequest,
)
from service.api.problems import ProblemError, problem_responses
from service.api.security import AdminDep
from service.api.state import AppState, StateDep
from service.core.status import BulkAction, BulkActionStatus
from service.sources.config_file import InboxConfig
from service.store import bulk
from service.store.bulk import BulkActionRow, BulkRequest

log = logging.getLogger("service.admin")

router = APIRouter(tags=["admin: bulk actions"])

ActionIdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="The bulk action's id.")]


def store_request(request: BulkActionRequest) -> BulkRequest:
    """The store's request of an admin API one: its filters, whichever they are, through
    `to_filter`, as the listings read them."""
    return BulkRequest(
        request.action, to_filter(request, list(request.status)), request.destination
    )


def recorded_query(request: BulkActionRequest) -> dict[str, Any]:
    """The search as the audit keeps it: the filters given, without what the row has in its
    own columns nor `dry_run`; read back by `stored_request`."""
    return request.model_dump(
        mode="json", exclude_defaults=True, exclude={"action", "destination", "dry_run"}
    )


def stored_request(action: BulkActionRow) -> BulkRequest:
    """The request an action was started with, from its audit row: to resume it."""
    return store_request(
        BulkActionRequest.model_validate(
            {**action.query, "action": action.action, "destination": action.destination}
        )
    )


def check_destination(inbox: InboxConfig, request: BulkActionRequest) -> None:
    """An unknown destination of a replay is refused as its own route refuses it (404)."""
    if request.action != BulkAction.REPLAY_DESTINATION or request.source is None:
        return
    if request.destination not in configured_of(inbox).get(request.source, []):
        raise ProblemError(404, f"source {request.source} has no destination {request.destination}")


@contextmanager
def action_errors() -> Iterator[None]:
    """The store's refusals as problems: unknown id → 404, resume refused → 409."""
    try:
        yield
    except bulk.ActionNotFound as exc:
        raise ProblemError(404, f"no bulk action with id {exc.args[0]}") from None
    except bulk.ResumeRefused as exc:
        raise ProblemError(409, exc.detail) from None


def document(action: BulkActionRow) -> BulkActionDocument:
    return BulkActionDocument.model_validate(action, from_attributes=True)


async def count(engine: AsyncEngine, request: BulkActionRequest, actor: str) -> int:
    """A dry run: how many messages the action would change now; nothing is recorded. A search
    that is cut short answers 422, as the listings' do."""
    with store_errors():
        return await bulk.count(engine, store_request(request), actor)


async def begin(
    engine: AsyncEngine, request: BulkActionRequest, actor: str
) -> tuple[BulkActionRow, BulkRequest]:
    """Count and record the action (not a dry run): its row, and what `bulk.run` walks."""
    started = store_request(request)
    with store_errors():
        action = await bulk.start(engine, started, recorded_query(request), actor)
    log.info(
        "bulk action started",
        extra={"actor": actor, "id": action.id, "action": action.action, "matched": action.matched},
    )
    return action, started


async def run_logged(engine: AsyncEngine, action: BulkActionRow, request: BulkRequest) -> None:
    """Walk the action to its end (`bulk.run`) and log how it ended."""
    ended = await bulk.run(engine, action, request)
    log.info(
        "bulk action ended",
        extra={"id": ended.id, "action": ended.action, "status": ended.status, "done": ended.done},
    )


def run_in_background(state: AppState, action: BulkActionRow, request: BulkRequest) -> None:
    if action.status != BulkActionStatus.RUNNING:  # nothing matched: finished as it began
        return
    state.background.start(run_logged(state.engine, action, request), f"bulk-action-{action.id}")


@router.post(
    "/messages/actions",
    status_code=202,
    response_model=BulkActionDocument,
    responses={
        200: {"model": BulkActionCount, "description": "The dry run's count."},
        **problem_responses(404),
    },
)
async def start_action(
    state: StateDep, admin: AdminDep, request: Annotated[BulkActionRequest, Body()]
) -> Any:
    """Retry, replay, discard or replay to one destination every message the filters match, in
    batches in the background; `dry_run` only counts."""
    check_destination(state.inbox, request)
    if request.dry_run:
        matched = await count(state.engine, request, admin.actor)
        return JSONResponse(BulkActionCount(matched=matched).model_dump())
    return document(await start_in_background(state, request, admin.actor))


async def start_in_background(
    state: AppState, request: BulkActionRequest, actor: str
) -> BulkActionRow:
    """Record the action and run its batches in the app's background (the console's too)."""
    action, started = await begin(state.engine, request, actor)
    run_in_background(state, action, started)
    return action


@router.get("/messages/actions", response_model=BulkActionList)
async def list_actions(
    state: StateDep, query: Annotated[BulkActionListQuery, Query()]
) -> BulkActionList:
    """The bulk actions, newest first, each with its query, who ran it and its progress."""
    return BulkActionList(
        items=[document(a) for a in await bulk.list_actions(state.engine, query.limit)]
    )


@router.get(
    "/messages/actions/{id}", response_model=BulkActionDocument, responses=problem_responses(404)
)
async def get_action(state: StateDep, id: ActionIdPath) -> BulkActionDocument:
    """One bulk action and its progress."""
    with action_errors():
        return document(await bulk.get(state.engine, id))


@router.post(
    "/messages/actions/{id}/resume",
    status_code=202,
    response_model=BulkActionDocument,
    responses=problem_responses(404, 409),
)
async def resume_action(state: StateDep, admin: AdminDep, id: ActionIdPath) -> BulkActionDocument:
    """Continue an interrupted bulk action, or one whose runner died (no batch for 30 s), after
    its last committed batch; a finished one, or one still running, answers 409."""
    with action_errors():
        action = await bulk.resume(state.engine, id)
    log.info(
        "bulk action resumed", extra={"actor": admin.actor, "id": id, "after": action.after_id}
    )
    run_in_background(state, action, stored_request(action))
    return document(action)
