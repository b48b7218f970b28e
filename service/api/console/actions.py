"""The console's state changes, each a POST carrying the session's CSRF token, each taken
through the admin API's route functions with a `console:` actor, so the history says where it
came from."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from service.api.admin import destinations as destinations_api
from service.api.admin import messages as messages_api
from service.api.admin import pauses as pauses_api
from service.api.admin.models import PauseRequest, RetryRequest, RetryResult
from service.api.console import views
from service.api.console.access import ActionDep, ConsoleError, Operator
from service.api.console.pages import bulk_retry_request, load_message, message_number
from service.api.console.views import FILTER_KEYS, url
from service.api.problems import ProblemError
from service.api.state import AppState, StateDep

router = APIRouter()


async def act(state: AppState, operator: Operator, message: str, action: str) -> Response:
    number = message_number(message)
    result: RetryResult
    try:
        if action == "replay" and (await load_message(state, message)).status != "processed":
            # A stale page's replay button: replaying means a processed message, nothing else.
            raise ProblemError(409, f"message {number} is not processed; nothing to replay")
        if action == "discard":
            result = await messages_api.discard_message(state, operator.admin, number)
        else:
            force = RetryRequest(force=action == "replay")
            result = await messages_api.retry_message(state, operator.admin, number, force)
    except ProblemError as exc:  # unknown message (404), or its status forbids it (409)
        raise ConsoleError(exc.status, f"Could not {action} message {number}", exc.detail) from None
    return RedirectResponse(f"/console/messages/{number}?done={result.action}", status_code=303)


@router.post("/messages/{message}/retry")
async def retry(message: str, state: StateDep, action: ActionDep) -> Response:
    """Give a failed or discarded message a fresh attempt budget."""
    return await act(state, action[0], message, "retry")


@router.post("/messages/{message}/replay")
async def replay(message: str, state: StateDep, action: ActionDep) -> Response:
    """Run a processed message's handlers again (asked for on the confirmation page)."""
    return await act(state, action[0], message, "replay")


@router.post("/messages/{message}/discard")
async def discard(message: str, state: StateDep, action: ActionDep) -> Response:
    """Set a message aside; its dedup row stays."""
    return await act(state, action[0], message, "discard")


async def act_on_destination(
    state: AppState, operator: Operator, message: str, name: str, action: str
) -> Response:
    number = message_number(message)
    try:
        if action == "discard":
            await destinations_api.discard_destination(state, operator.admin, number, name)
        else:
            await destinations_api.retry_destination(state, operator.admin, number, name)
    except ProblemError as exc:  # unknown message or destination (404), or not allowed (409)
        raise ConsoleError(
            exc.status, f"Could not {action} destination {name} of message {number}", exc.detail
        ) from None
    return RedirectResponse(
        f"/console/messages/{number}?done=destination_{action}", status_code=303
    )


@router.post("/messages/{message}/destinations/{name}/retry")
async def retry_destination(
    message: str, name: str, state: StateDep, action: ActionDep
) -> Response:
    """Run one failed or discarded destination of a message again; the others stay."""
    return await act_on_destination(state, action[0], message, name, "retry")


@router.post("/messages/{message}/destinations/{name}/discard")
async def discard_destination(
    message: str, name: str, state: StateDep, action: ActionDep
) -> Response:
    """Set one destination of a message aside."""
    return await act_on_destination(state, action[0], message, name, "discard")


@router.post("/bulk-retry")
async def bulk_retry(state: StateDep, action: ActionDep) -> Response:
    """Retry every message matching the confirmed filters."""
    operator, form = action
    items = views.query_items(form.fields, FILTER_KEYS)
    result = await messages_api.bulk_retry(state, operator.admin, bulk_retry_request(items))
    return operator.page(
        "bulk_done.html",
        title="Messages retried",
        nav="messages",
        matched=result.matched,
        retried=result.retried,
        list_url=url("/console/messages", items),
    )


@router.post("/sources/{name}/pause")
async def pause_source(name: str, state: StateDep, action: ActionDep) -> Response:
    """Pause a source's processing, with the operator's name and a reason."""
    operator, form = action
    try:
        request = PauseRequest(operator=form.get("operator") or "", reason=form.get("reason") or "")
    except ValidationError:
        raise ConsoleError(
            422, f"Could not pause {name}", "give your name and a reason (each 1 to 512 characters)"
        ) from None
    try:
        await pauses_api.pause_source(state, operator.admin, name, request)
    except ProblemError as exc:
        raise ConsoleError(exc.status, f"Could not pause {name}", exc.detail) from None
    return RedirectResponse(f"/console/sources/{name}?done=paused", status_code=303)


@router.post("/sources/{name}/resume")
async def resume_source(name: str, state: StateDep, action: ActionDep) -> Response:
    """Resume a paused source."""
    try:
        await pauses_api.resume_source(state, action[0].admin, name)
    except ProblemError as exc:
        raise ConsoleError(exc.status, f"Could not resume {name}", exc.detail) from None
    return RedirectResponse(f"/console/sources/{name}?done=resumed", status_code=303)
