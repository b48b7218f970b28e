"""The console's live view: `GET /admin/tail`'s stream for people, under the console's session."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from service.api.admin.tail import TailQuery, tail_response
from service.api.console import views
from service.api.console.access import ConsoleError, OperatorDep
from service.api.console.pages import cleaned, source_names
from service.api.state import StateDep
from service.core.status import TailKind

router = APIRouter()

KEYS = ("source", "status", "event_type")


@router.get("/tail")
async def live(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """Each delivery, duplicate and outcome as it happens, newest on top."""
    items, clean = cleaned(request, KEYS)
    if not clean:
        return RedirectResponse(views.url("/console/tail", items), status_code=303)
    query, problems = parse(items)
    return operator.page(
        "tail.html",
        title="Live",
        nav="tail",
        sources=await source_names(state),
        kinds=[k.value for k in TailKind],
        form=dict(items),
        chosen_kinds=[v for k, v in items if k == "status"],
        problems=problems,
        stream_url=None if query is None else views.url("/console/tail/live", items),
    )


@router.get("/tail/live")
async def live_stream(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """The live view's events, as Server-Sent Events for its script."""
    items, _ = cleaned(request, KEYS)
    query, problems = parse(items)
    if query is None:
        raise ConsoleError(422, "Filters that cannot be used", "; ".join(problems))
    return tail_response(state.engine, query.filters())


def parse(items: views.QueryItems) -> tuple[TailQuery | None, list[str]]:
    """The URL's filters as the API's query; `source` repeats as `status` does."""
    sources = [v for k, v in items if k == "source"]
    query, problems = views.parse_query(TailQuery, [(k, v) for k, v in items if k != "source"])
    if query is None:
        return None, problems
    try:
        return TailQuery.model_validate({**query.model_dump(), "source": sources}), []
    except ValueError:
        return None, ["source: not a source name"]
