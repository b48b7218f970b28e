"""The messages page's "Export JSON lines": `GET /admin/messages/export`'s lines for the
filters the page shows, under the console's session."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.api.admin.export import export_response
from service.api.admin.models import ExportQuery
from service.api.console import views
from service.api.console.access import ConsoleError, OperatorDep
from service.api.problems import ProblemError
from service.api.state import StateDep

router = APIRouter()


@router.get("/messages/export")
async def export(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """The messages matching the URL's filters, with their bodies, as a JSON lines file."""
    items = views.query_items(request.query_params.multi_items(), (*views.FILTER_KEYS, "limit"))
    query, problems = views.parse_query(ExportQuery, items)
    if query is None:
        raise ConsoleError(422, "Filters that cannot be used", "; ".join(problems))
    try:
        response = await export_response(state.engine, query)
    except ProblemError as exc:
        raise ConsoleError(exc.status, "Could not export", exc.detail) from None
    response.headers["Content-Disposition"] = 'attachment; filename="messages.jsonl"'
    return response
