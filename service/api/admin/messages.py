"""Admin routes over messages: list, inspect, retry, replay, discard, dead letters."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query

from service.api.admin.cursor import CursorError, decode_cursor, encode_cursor
from service.api.admin.models import (
    MAX_ID,
    MAX_PAYLOAD_DEPTH,
    BulkRetryRequest,
    BulkRetryResult,
    DeadLetterGroup,
    DeadLetterGroups,
    DeadLetterQuery,
    DestinationState,
    MessageDetail,
    MessageFilters,
    MessagePage,
    MessageQuery,
    MessageSummary,
    RetryRequest,
    RetryResult,
)
from service.api.problems import ProblemError, problem_responses
from service.api.security import Admin, AdminDep
from service.api.state import AppState, StateDep
from service.core import tracing
from service.core.schema import Status
from service.sources.base import is_json_media_type, media_type_of
from service.store import admin as store
from service.store.admin import MessageFilter, Position
from service.store.search import SearchError, SearchTooBroad, build_search

log = logging.getLogger("service.admin")

router = APIRouter(tags=["admin: messages"])

MessageIdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="The inbox row id.")]


@contextmanager
def store_errors() -> Iterator[None]:
    """The store's refusals as problems: unknown id → 404, a disallowed transition → 409, a
    search the database refused or cut short (too broad) → 422."""
    try:
        yield
    except store.MessageNotFound as exc:
        raise ProblemError(404, f"no message with id {exc.args[0]}") from None
    except store.InvalidTransition as exc:
        raise ProblemError(409, exc.detail) from None
    except (SearchError, SearchTooBroad) as exc:
        raise ProblemError(422, str(exc)) from None


def to_filter(filters: MessageFilters, statuses: list[str]) -> MessageFilter:
    return MessageFilter(
        source=filters.source,
        statuses=tuple(statuses),
        event_type=filters.event_type,
        message_id=filters.message_id,
        received_after=filters.received_after,
        received_before=filters.received_before,
        error_type=filters.error_type,
        ordering_key=filters.ordering_key,
        held=filters.held,
        search=build_search(
            q=filters.q,
            id_prefix=filters.id_prefix,
            contains=filters.contains,
            where=filters.where,
            header=filters.header,
        ),
    )


def cursor_scope(listing: str, filters: MessageFilter) -> str:
    """What a cursor is bound to: the listing and its filters, canonically written."""
    fields: dict[str, Any] = {
        "source": filters.source,
        "statuses": sorted(set(filters.statuses)),
        "event_type": filters.event_type,
        "message_id": filters.message_id,
        "received_after": filters.received_after,
        "received_before": filters.received_before,
        "error_type": filters.error_type,
    }
    # Named only when set, so that the cursors of pages listed before these filters existed
    # still hold.
    fields |= {
        name: value
        for name, value in (("ordering_key", filters.ordering_key), ("held", filters.held))
        if value is not None
    }
    if filters.search is not None:
        fields["search"] = filters.search.written()
    return listing + json.dumps(fields, sort_keys=True, default=str)


async def page(
    state: AppState, listing: str, filters: MessageFilter, limit: int, cursor: str | None
) -> MessagePage:
    scope = cursor_scope(listing, filters)
    after: Position | None = None
    if cursor is not None:
        try:
            after = decode_cursor(state.cursor_key, scope, cursor)
        except CursorError as exc:
            raise ProblemError(400, str(exc)) from None
    with store_errors():
        rows, last = await store.list_messages(state.engine, filters, limit, after)
    return MessagePage(
        items=[MessageSummary.from_row(r) for r in rows],
        next_cursor=None if last is None else encode_cursor(state.cursor_key, scope, last),
    )


@router.get("/messages", response_model=MessagePage, responses=problem_responses(400))
async def list_messages(state: StateDep, query: Annotated[MessageQuery, Query()]) -> MessagePage:
    """List messages, newest first, filtered and paged by cursor."""
    filters = to_filter(query, list(query.status))
    return await page(state, "messages", filters, query.limit, query.cursor)


@router.get("/dead-letters", response_model=MessagePage, responses=problem_responses(400))
async def list_dead_letters(
    state: StateDep, query: Annotated[DeadLetterQuery, Query()]
) -> MessagePage:
    """List dead messages (attempts exhausted or failed permanently), newest first."""
    filters = to_filter(query, [Status.DEAD])
    return await page(state, "dead-letters", filters, query.limit, query.cursor)


@router.get("/dead-letters/groups", response_model=DeadLetterGroups)
async def dead_letter_groups(
    state: StateDep, query: Annotated[MessageFilters, Query()]
) -> DeadLetterGroups:
    """Count dead messages by the error type of their latest failed attempt."""
    with store_errors():
        groups = await store.dead_letter_groups(state.engine, to_filter(query, ["dead"]))
    return DeadLetterGroups(groups=[DeadLetterGroup.model_validate(asdict(g)) for g in groups])


def decode_body(body: bytes, content_type: str | None) -> tuple[Any, str | None]:
    """(payload, None) for a JSON body the detail can carry, else (None, base64 of the bytes)."""
    if is_json_media_type(media_type_of(content_type or "")):
        payload = displayable_json(body)
        if payload is not None:
            return payload, None
    return None, base64.b64encode(body).decode()


def displayable_json(body: bytes) -> Any:
    """`body` parsed as JSON, or None unless that parses and can be answered as JSON again:
    bounded nesting, no NaN or infinity, no unpaired surrogate (a `\\ud800` escape)."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if nested_deeper_than(payload, MAX_PAYLOAD_DEPTH):
        return None
    try:
        json.dumps(payload, allow_nan=False, ensure_ascii=False).encode()
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return None
    return payload


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests more than `limit` arrays and objects (without recursing)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def trace_id_of(trace_context: Any) -> str | None:
    """The trace id in a stored `{"traceparent": "00-<trace id>-<span id>-<flags>"}`."""
    if isinstance(trace_context, str):
        trace_context = json.loads(trace_context)
    if not isinstance(trace_context, dict):
        return None
    parts = str(trace_context.get("traceparent", "")).split("-")
    return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else None


@router.get("/messages/{id}", response_model=MessageDetail, responses=problem_responses(404))
async def get_message(state: StateDep, id: MessageIdPath) -> MessageDetail:
    """Show one message: headers, body, and its attempt and admin-action history."""
    with store_errors():
        row = await store.get_message(state.engine, id)
    return detail_from_row(row)


def detail_from_row(row: Mapping[str, Any]) -> MessageDetail:
    """The detail document of a `store.get_message` row (the command line shows it too)."""
    headers = row["headers"]
    if isinstance(headers, str):
        headers = json.loads(headers)
    payload, body_base64 = decode_body(bytes(row["body"]), row["content_type"])
    return MessageDetail.model_validate(
        {
            **row,
            "attempt_count": row["attempts"],
            "headers": headers,
            "payload": payload,
            "body_base64": body_base64,
            "attempts": row["attempt_history"],
            "destinations": [DestinationState.from_row(d) for d in row["destinations"]],
            "trace_id": trace_id_of(row["trace_context"]),
        }
    )


@router.post(
    "/messages/retry",
    response_model=BulkRetryResult,
    responses=problem_responses(400),
)
async def bulk_retry(
    state: StateDep, admin: AdminDep, request: Annotated[BulkRetryRequest, Body()]
) -> BulkRetryResult:
    """Retry every message matching the filters, in batches; `dry_run` only counts."""
    filters = to_filter(request, list(request.status))
    with (
        tracing.admin_span("bulk_retry", force=request.force, dry_run=request.dry_run) as span,
        store_errors(),
    ):
        result = await store.bulk_retry(
            state.engine, filters, admin.actor, force=request.force, dry_run=request.dry_run
        )
        if span is not None:
            span.set_attribute("inbox.admin.matched", result.matched)
            span.set_attribute("inbox.admin.retried", result.retried)
    for action, count in result.by_action.items():
        state.metrics.admin_actions.labels(action).inc(count)
    log.info(
        "bulk retry",
        extra={
            "actor": admin.actor,
            "dry_run": request.dry_run,
            "matched": result.matched,
            "retried": result.retried,
            "source": request.source,
        },
    )
    return BulkRetryResult(matched=result.matched, retried=result.retried)


@router.post(
    "/messages/{id}/retry", response_model=RetryResult, responses=problem_responses(404, 409)
)
async def retry_message(
    state: StateDep,
    admin: AdminDep,
    id: MessageIdPath,
    request: Annotated[RetryRequest | None, Body()] = None,
) -> RetryResult:
    """Give a retrying, dead or discarded message a fresh attempt budget; replay with force."""
    force = request.force if request is not None else False
    with tracing.admin_span("replay" if force else "retry", id=id) as span, store_errors():
        row, action = await store.retry_message(state.engine, id, admin.actor, force)
        if span is not None:
            span.set_attribute("inbox.admin.result", action)
    return acted(state, admin, action, row)


@router.post(
    "/messages/{id}/discard", response_model=RetryResult, responses=problem_responses(404, 409)
)
async def discard_message(state: StateDep, admin: AdminDep, id: MessageIdPath) -> RetryResult:
    """Set a message aside as discarded, at once; its dedup row stays, so redeliveries stay
    duplicates.

    A `processing` message is discarded too unless a live attempt holds its row (a killed
    worker's claim is dropped; that attempt's late finish changes nothing); a held one answers
    409 after a wait of up to 2 s, as does a `processed` one.
    """
    with tracing.admin_span("discard", id=id) as span, store_errors():
        row, changed = await store.discard_message(state.engine, id, admin.actor)
        if span is not None:
            span.set_attribute("inbox.admin.result", "discarded" if changed else "none")
    return acted(state, admin, store.ADMIN_DISCARD if changed else "none", row)


def acted(
    state: AppState,
    admin: Admin,
    action: str,
    row: Mapping[str, Any],
    *,
    destination: str | None = None,
) -> RetryResult:
    """Count and log an admin action on one message, or on one of its destinations (unless it
    was "none"), and answer it."""
    if action != "none":
        state.metrics.admin_actions.labels(action).inc()
        extra = {
            "actor": admin.actor,
            "id": row["id"],
            "source": row["source"],
            "message_id": row["message_id"],
        }
        if destination is not None:
            extra["destination"] = destination
        log.info(action, extra=extra)
    return RetryResult.model_validate({**row, "attempt_count": row["attempts"], "action": action})
