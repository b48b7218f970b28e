"""The console's Outbox page: `GET /admin/outbox` for people, each endpoint on one row."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.api.admin.outbox import collect_endpoints
from service.api.console.access import OperatorDep
from service.api.state import StateDep
from service.store import admin as store

router = APIRouter()


@router.get("/outbox")
async def outbox(state: StateDep, operator: OperatorDep) -> Response:
    """Each endpoint of the outbox: its URL, whether it signs, its outgoing messages by status,
    the oldest unsent one's age, its breaker and its pause."""
    listed = await collect_endpoints(state.engine, state.inbox, state.ended_counts)
    return operator.page(
        "outbox.html",
        title="Outbox",
        nav="outbox",
        endpoints=listed.endpoints,
        statuses=store.STATUSES,
    )
