"""The console's page of refused deliveries: `GET /admin/rejected` for people."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from service.api.admin.rejections import RejectedQuery, rejected_page
from service.api.console import views
from service.api.console.access import OperatorDep
from service.api.console.pages import cleaned, source_names
from service.api.state import StateDep

router = APIRouter()

KEYS = ("source", "limit", "before")


@router.get("/rejected")
async def rejected(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """Deliveries refused with a 4xx in the last day, newest first, with why and their
    (redacted) headers."""
    items, clean = cleaned(request, KEYS)
    if not clean:
        return RedirectResponse(views.url("/console/rejected", items), status_code=303)
    query, problems = views.parse_query(RejectedQuery, items)
    page = None if query is None else await rejected_page(state.engine, query)
    kept = [(k, v) for k, v in items if k != "before"]
    return operator.page(
        "rejected.html",
        title="Rejected deliveries",
        nav="rejected",
        sources=await source_names(state, outgoing=False),  # an endpoint receives nothing
        form=dict(items),
        problems=problems,
        page=page,
        next_url=None
        if page is None or page.next_before is None
        else views.url("/console/rejected", [*kept, ("before", str(page.next_before))]),
    )
