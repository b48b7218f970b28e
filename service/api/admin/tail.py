"""`GET /admin/tail`: deliveries, duplicates and outcomes as they happen, as Server-Sent Events
(the `tail` command's and the console's live view's stream; docs/operating.md#live-tail)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import StreamingResponse

from service.api.admin.models import EventTypeGlob, SourceName
from service.api.state import StateDep
from service.core.status import TailKind
from service.store.tail import TailEvent, TailFilter, follow

router = APIRouter(tags=["admin: operations"])

# A comment line this often while nothing happens: proxies keep the stream open, and a client
# that went away is noticed when it cannot be written to.
KEEPALIVE_SECONDS = 15.0


class TailQuery(BaseModel):
    """Query parameters of `GET /admin/tail`; the filters combine with AND."""

    model_config = ConfigDict(extra="forbid")

    source: list[SourceName] = Field(
        default=[], description="Only these sources' messages (repeatable); none: every source."
    )
    status: list[TailKind] = Field(
        default=[],
        description="Only these kinds of event (repeatable): `accepted`, `duplicate`, "
        "`processed`, `failed`, `dead`; none: every kind.",
    )
    event_type: EventTypeGlob | None = Field(
        default=None, description="Only this event type (`*` and `?` wildcards)."
    )

    def filters(self) -> TailFilter:
        return TailFilter(tuple(self.source), tuple(self.status), self.event_type)


class TailEventDocument(BaseModel):
    """One event of the tail: the `data` of a Server-Sent Event named after its `kind`."""

    kind: TailKind = Field(
        description="`accepted` (a first delivery, recorded), `duplicate` (a redelivery of a "
        "recorded message), or an attempt's outcome: `processed`, `failed` (to be retried), "
        "`dead`."
    )
    at: datetime = Field(description="When: the delivery's arrival, or the attempt's end.")
    id: int = Field(description="The inbox row id (GET /admin/messages/{id}).")
    source: str
    message_id: str = Field(description="The dedup key.")
    event_type: str | None
    attempt: int | None = Field(default=None, description="An outcome's attempt number.")
    destination: str | None = Field(
        default=None, description="The named destination an outcome is of, if any."
    )
    error_type: str | None = Field(default=None, description="A failure's exception type.")
    error: str | None = Field(default=None, description="A failure's error message.")
    deliveries: int | None = Field(
        default=None,
        description="A duplicate's: the deliveries of the message counted so far; null for "
        "one that arrived while the message's handlers ran, which the worker counts once they "
        "end. Several redeliveries between two reads of the tail show as one event.",
    )

    @classmethod
    def of(cls, event: TailEvent) -> TailEventDocument:
        return cls.model_validate(event, from_attributes=True)


async def event_stream(engine: AsyncEngine, filters: TailFilter) -> AsyncIterator[bytes]:
    """The tail as Server-Sent Events: a `: following` comment once it is positioned (what
    happens after it is shown), then one event for each thing that happens, named after its
    kind."""
    idle = 0.0
    started = False
    async for events in follow(engine, filters):
        if not started:
            started = True
            yield b": following\n\n"
        for event in events:
            data = TailEventDocument.of(event).model_dump_json()
            yield f"event: {event.kind.value}\ndata: {data}\n\n".encode()
        idle = 0.0 if events else idle + 0.5
        if idle >= KEEPALIVE_SECONDS:
            idle = 0.0
            yield b": keepalive\n\n"


def tail_response(engine: AsyncEngine, filters: TailFilter) -> StreamingResponse:
    return StreamingResponse(
        event_stream(engine, filters),
        media_type="text/event-stream",
        # Not buffered by a proxy (nginx honours this header) nor kept by any cache.
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/tail",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "A stream of Server-Sent Events, until the client disconnects: "
            "one per event, `event:` its kind and `data:` a JSON document (schema "
            "TailEventDocument). Lines starting with `:` are comments: `: following` once "
            "the stream is positioned, `: keepalive` every 15 s of quiet.",
            "content": {
                "text/event-stream": {
                    "schema": TailEventDocument.model_json_schema(
                        ref_template="#/components/schemas/{model}"
                    ),
                    "example": 'event: failed\ndata: {"kind": "failed", "at": '
                    '"2026-12-09T10:00:01Z", "id": 42, "source": "payments", "message_id": '
                    '"evt_1", "event_type": "charge.succeeded", "attempt": 1, '
                    '"destination": null, "error_type": "ConnectionError", "error": '
                    '"billing down", "deliveries": null}\n\n',
                }
            },
        }
    },
)
async def tail(state: StateDep, query: Annotated[TailQuery, Query()]) -> StreamingResponse:
    """Follow deliveries, duplicates and outcomes as they happen (Server-Sent Events).

    Starts at the moment of the request: each message accepted, each duplicate delivery and
    each attempt's outcome (processed, failed with its error, dead) from then on, in any
    process on the database, filtered by source, kind and event type. Woken by the NOTIFY
    ingest sends, read every half second otherwise.
    """
    return tail_response(state.engine, query.filters())
