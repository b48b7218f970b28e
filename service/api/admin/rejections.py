"""`GET /admin/rejected`: the deliveries ingest refused with a 4xx, newest first, for finding
a misconfigured sender without reading logs (docs/operating.md#rejected-deliveries)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from service.api.admin.models import SourceName
from service.api.state import StateDep
from service.store import rejections as store

router = APIRouter(tags=["admin: operations"])


class RejectedQuery(BaseModel):
    """Query parameters of `GET /admin/rejected`."""

    model_config = ConfigDict(extra="forbid")

    source: SourceName | None = Field(default=None, description="Only this source's.")
    limit: int = Field(default=50, ge=1, le=500, description="Page size, 1 to 500.")
    before: int | None = Field(
        default=None,
        ge=1,
        le=2**63 - 1,
        description="Only rows older than this id: the `next_before` of the previous page.",
    )


class RejectedDelivery(BaseModel):
    id: int
    source: str
    received_at: datetime
    status: int = Field(description="The HTTP status ingest answered.")
    reason: str = Field(
        description="Why, as in the `reason` of `webhook_inbox_deliveries_total`: "
        "`unauthenticated` (bad or missing signature or token, stale timestamp), "
        "`bad_request` (no message id, unreadable body, an event type refused), `too_large`, "
        "`headers_too_large`, `unsupported_media_type`, …"
    )
    detail: str = Field(description="The problem document's detail, as the sender got it.")
    size: int = Field(description="The body's size in bytes (for `too_large`, as announced).")
    headers: dict[str, str] = Field(
        description="The request's headers, with signatures, tokens and other credentials "
        "redacted as a recorded message's are. The body is never kept."
    )
    request_id: str | None = Field(description="The request's `X-Request-ID`, as logged.")


class RejectedPage(BaseModel):
    items: list[RejectedDelivery]
    next_before: int | None = Field(
        description="Pass as `before` for the next page; null on the last."
    )


async def rejected_page(engine: AsyncEngine, query: RejectedQuery) -> RejectedPage:
    """One page of refused deliveries: the API's answer, and the `rejected` command's."""
    rows = await store.list_rejections(engine, query.source, query.limit, query.before)
    items = [RejectedDelivery.model_validate(row) for row in rows]
    full = len(items) == query.limit
    return RejectedPage(items=items, next_before=items[-1].id if full else None)


@router.get("/rejected", response_model=RejectedPage)
async def list_rejected(state: StateDep, query: Annotated[RejectedQuery, Query()]) -> RejectedPage:
    """List deliveries refused with a 4xx in the last day, newest first (headers redacted)."""
    return await rejected_page(state.engine, query)
