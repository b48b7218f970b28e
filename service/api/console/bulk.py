"""The console's bulk actions: a search's matches discarded or replayed (or retried) as a
recorded action, counted before it is confirmed, and its progress once it runs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from service.api.admin import bulk_actions as bulk_api
from service.api.admin.models import BulkActionRequest
from service.api.console import views
from service.api.console.access import ActionDep, ConsoleError, OperatorDep
from service.api.console.views import FILTER_KEYS, url
from service.api.problems import ProblemError
from service.api.state import StateDep
from service.core.status import BulkAction, BulkActionStatus

router = APIRouter()

KEYS = ("action", *FILTER_KEYS)
# The actions a search's matches can be given here; a replay to one destination is the source
# page's.
OFFERED = (BulkAction.RETRY, BulkAction.REPLAY, BulkAction.DISCARD)


def action_request(items: views.QueryItems) -> BulkActionRequest:
    """The admin API's request of a bulk action for these filters (from a URL or a form)."""
    request, problems = views.parse_query(BulkActionRequest, items)
    if request is None or request.action not in OFFERED:
        raise ConsoleError(400, "Unusable bulk action", "; ".join(problems) or "no such action")
    return request


@router.get("/bulk-action")
async def confirm_bulk_action(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """Count what the action would change (the API's dry run), and ask."""
    items = views.query_items(request.query_params.multi_items(), KEYS)
    asked = action_request(items)
    matched = await bulk_api.count(state.engine, asked, operator.admin.actor)
    filters = [(k, v) for k, v in items if k != "action"]
    return operator.page(
        "bulk_action.html",
        title=f"{asked.action.capitalize()} matching messages",
        nav="messages",
        action=asked.action.value,
        matched=matched,
        others=[
            (a.value, url("/console/bulk-action", [("action", a.value), *filters]))
            for a in OFFERED
            if a != asked.action
        ],
        filters=filters,
        back_url=url("/console/messages", filters),
    )


@router.post("/bulk-action")
async def start_bulk_action(state: StateDep, action: ActionDep) -> Response:
    """Start the confirmed action; its progress page follows it."""
    operator, form = action
    asked = action_request(views.query_items(form.fields, KEYS))
    started = await bulk_api.start_in_background(state, asked, operator.admin.actor)
    return RedirectResponse(f"/console/bulk-actions/{started.id}", status_code=303)


@router.get("/bulk-actions/{number}")
async def bulk_action_progress(number: int, state: StateDep, operator: OperatorDep) -> Response:
    """An action's progress, reloaded every second while it runs."""
    try:
        shown = await bulk_api.get_action(state, number)
    except ProblemError as exc:
        raise ConsoleError(exc.status, "No such bulk action", exc.detail) from None
    return operator.page(
        "bulk_progress.html",
        title=f"Bulk action {shown.id}",
        nav="messages",
        shown=shown,
        running=shown.status == BulkActionStatus.RUNNING,
        percent=100 if not shown.matched else round(100 * shown.done / shown.matched),
    )
