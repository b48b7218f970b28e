"""`GET /admin/issues`: failures grouped by cause, one issue per fingerprint, most recently
failing first (docs/operating.md#issues-failures-grouped-by-cause)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.admin.models import IssueList, IssueQuery, IssueSummary
from service.api.state import StateDep
from service.store.issues import list_issues

router = APIRouter(tags=["admin: operations"])


@router.get("/issues", response_model=IssueList)
async def issues(state: StateDep, query: Annotated[IssueQuery, Query()]) -> IssueList:
    """List failures grouped by cause, most recent first, with their messages now retrying and
    dead."""
    rows = await list_issues(state.engine, query.source, query.status, query.limit)
    return IssueList(items=[IssueSummary.model_validate(row) for row in rows])
