"""`POST /webhooks/{source}`: verify a delivery, record its message ids, then answer 2xx."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, PlainTextResponse, Response

from service.core.problems import problem, problem_responses, unavailable
from service.core.state import StateDep
from service.processing.sync import HandlerFailed, SyncProcessor
from service.sources.base import Handshake, RawDelivery, Rejected, Source
from service.store.errors import StoreUnavailable
from service.store.ingest import record_messages

log = logging.getLogger("service.ingest")

router = APIRouter(tags=["ingest"])

REDACTED = "[redacted]"


class Accepted(BaseModel):
    status: str = Field(
        description="`accepted` (first delivery, recorded), `duplicate` (already recorded: "
        "nothing more happens) or `processed` (sync mode: the handlers committed with it)."
    )
    id: int | None = Field(default=None, description="The inbox row id; absent for a duplicate.")
    message_id: str = Field(description="The message's dedup key as the source defines it.")


class BatchResult(BaseModel):
    message_id: str
    status: str


class BatchAccepted(BaseModel):
    results: list[BatchResult] = Field(description="One entry per event, in the batch's order.")


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing as soon as more than `limit` bytes are announced or read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def stored_headers(source: Source, request: Request) -> dict[str, str]:
    """The request headers worth keeping, with every credential and signature value redacted."""
    return {
        name: (REDACTED if source.is_sensitive_header(name) else value)
        for name, value in request.headers.items()
    }


def handshake_response(handshake: Handshake) -> Response:
    if isinstance(handshake.body, bytes | str):
        return PlainTextResponse(
            handshake.body, status_code=handshake.status, headers=dict(handshake.headers)
        )
    return JSONResponse(
        handshake.body, status_code=handshake.status, headers=dict(handshake.headers)
    )


INGEST_DESCRIPTION = """
Receives one delivery for the configured source `{source}`. The body is read as raw bytes
(at most `INBOX_MAX_BODY_BYTES`) and verified by the source's kind before anything parses it;
the message id is then recorded in the inbox, and the answer is sent only after that commit.

A redelivery of a recorded message id is answered 200 `duplicate` and changes nothing but the
message's `receive_count`. Errors are RFC 9457 problem documents and record nothing.
"""


@router.post(
    "/webhooks/{source}",
    summary="Receive a delivery",
    description=INGEST_DESCRIPTION,
    response_model=Accepted | BatchAccepted,
    responses={
        **problem_responses(400, 401, 404, 413, 415, 500, 503),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "The delivery exactly as the sender signed it.",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "*/*": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
)
async def receive(source: str, request: Request, state: StateDep) -> Response:
    started = time.perf_counter()
    configured = state.inbox.sources.get(source)
    if configured is None:
        return problem(404, f"no source named {source!r} is configured")
    try:
        body = await read_body(request, state.settings.max_body_bytes)
    except BodyTooLarge:
        return problem(
            413, f"body is larger than the limit of {state.settings.max_body_bytes} bytes"
        )
    except ClientDisconnect:
        return problem(400, "the client disconnected before sending the whole body")

    delivery = RawDelivery(request.method, request.headers, request.query_params, body)
    try:
        verdict = await configured.authenticate(delivery)
    except Rejected as exc:
        log_delivery(source, None, f"rejected:{exc.reason}", started)
        return problem(exc.status, exc.detail, title=exc.title)
    if isinstance(verdict, Handshake):
        log_delivery(source, None, "handshake", started)
        return handshake_response(verdict)

    pipeline = state.pipelines.get(source)
    sync = (
        SyncProcessor(pipeline) if pipeline is not None and pipeline.config.mode == "sync" else None
    )
    try:
        results = await record_messages(
            state.engine,
            source,
            verdict.items,
            stored_headers(configured, request),
            body,
            delivery.content_type or None,
            process=sync,
        )
    except StoreUnavailable:
        log_delivery(source, None, "unavailable", started)
        return unavailable()
    except HandlerFailed as exc:
        log.error(
            "sync handler failed",
            exc_info=exc.__cause__,
            extra={"source": source, "message_id": exc.message_id},
        )
        log_delivery(source, exc.message_id, "handler_failed", started)
        retry = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.retry_after else None
        return problem(
            500,
            "a handler failed; nothing was recorded, so a redelivery runs it again",
            headers=retry,
        )
    for result in results:
        log_delivery(source, result.message_id, result.outcome, started)
    status, payload = configured.respond(results, verdict.batch)
    return JSONResponse(payload, status_code=status)


def log_delivery(source: str, message_id: str | None, outcome: str, started: float) -> None:
    fields: dict[str, Any] = {
        "source": source,
        "message_id": message_id,
        "outcome": outcome,
        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
    }
    log.info("delivery", extra=fields)
