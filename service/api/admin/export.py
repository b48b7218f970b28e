"""`GET /admin/messages/export`: every message a search matches, with its body, as JSON lines
(docs/search.md#exporting); the command line's `messages export` and the console's link write
the same lines."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import StreamingResponse

from service.api.admin.messages import delivery_from_row, store_errors, to_filter
from service.api.admin.models import ExportQuery, MessageDelivery
from service.api.state import StateDep
from service.store import admin as store
from service.store.admin import MessageFilter

log = logging.getLogger("service.admin")

router = APIRouter(tags=["admin: messages"])

MEDIA_TYPE = "application/x-ndjson"


def export_line(row: dict[str, Any]) -> bytes:
    """One line of an export: the message's `MessageDelivery` document, then a newline."""
    return delivery_from_row(row).model_dump_json().encode() + b"\n"


async def started_export(
    engine: AsyncEngine, filters: MessageFilter, limit: int | None
) -> AsyncIterator[bytes]:
    """The export's lines, its first page already read: a search the store refuses or cuts
    short as too broad raises here, before a byte is sent. A later page that fails raises from
    the lines themselves, so the stream ends short of its end rather than looking whole."""
    pages = store.matching_pages(engine, filters, limit=limit)
    with store_errors():
        first = await anext(pages)
    return export_lines(first, pages)


async def export_lines(
    first: list[dict[str, Any]], rest: AsyncIterator[list[dict[str, Any]]]
) -> AsyncIterator[bytes]:
    """The lines of the first page, then of each page after it as it is read."""
    exported = 0
    try:
        for row in first:
            yield export_line(row)
        exported = len(first)
        async for page in rest:
            for row in page:
                yield export_line(row)
            exported += len(page)
    except Exception as exc:
        log.warning("export cut short", extra={"exported": exported, "error": type(exc).__name__})
        raise


async def export_response(engine: AsyncEngine, query: ExportQuery) -> StreamingResponse:
    """The export as an HTTP answer (the admin route's and the console's); a refused search is
    a `ProblemError` (422), raised before the answer starts."""
    with store_errors():
        filters = to_filter(query, list(query.status))
    return StreamingResponse(
        await started_export(engine, filters, query.limit),
        media_type=MEDIA_TYPE,
        # Not buffered by a proxy (nginx honours this header), nor kept by any cache.
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/messages/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "JSON lines: one `MessageDelivery` document a line, newest first, "
            "for every message the filters match (up to `limit`); nothing else. A complete "
            "export ends with the response's end; one that fails after it started (a later "
            "page's search past 5 s, the database gone) is cut off without the response's "
            "end (a chunked answer without its last chunk: curl exits 18), never left "
            "looking whole.",
            "content": {
                MEDIA_TYPE: {
                    "schema": MessageDelivery.model_json_schema(
                        ref_template="#/components/schemas/{model}"
                    ),
                    "example": '{"id":42,"source":"payments","message_id":"evt_1",'
                    '"event_type":"charge.succeeded","status":"dead","attempt_count":5,'
                    '"attempt_count_total":5,"receive_count":1,'
                    '"received_at":"2026-12-09T10:00:00Z","last_received_at":'
                    '"2026-12-09T10:00:00Z","next_attempt_at":null,"processed_at":null,'
                    '"last_error":"billing down","ordering_key":null,"held_behind":null,'
                    '"content_type":"application/json","headers":{"stripe-signature":'
                    '"[redacted]"},"payload":{"id":"evt_1"},"body_base64":null}\n',
                }
            },
        }
    },
)
async def export_messages(
    state: StateDep, query: Annotated[ExportQuery, Query()]
) -> StreamingResponse:
    """Export the messages matching the filters, with their bodies, as JSON lines.

    The same filters as `GET /admin/messages`, search among them; newest first, read in
    keyset pages of 250, each page one statement (a search's bounded at 5 s), so that a
    million matches stream in flat memory. A refused search, or a first page past its time
    bound, answers 422 before anything streams. Not a snapshot: each page is read when the
    stream reaches it, so a message whose status changes meanwhile may be left out by a
    status filter; messages received after the export started are never in it.
    """
    return await export_response(state.engine, query)
