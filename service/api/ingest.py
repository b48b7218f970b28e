"""`POST /webhooks/{source}`: verify a delivery, record its message ids, then answer 2xx."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.datastructures import QueryParams
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from service.api.problems import problem, problem_responses, unavailable
from service.api.request_id import request_id_of
from service.api.state import AppState, StateDep
from service.core import tracing
from service.core.logging import REQUEST_ID, info_event
from service.core.metrics import UNKNOWN_SOURCE, Metrics
from service.processing.sync import HandlerFailed, record_and_process
from service.sources.base import AnySource, BadDelivery, Handshake, RawDelivery, Rejected
from service.sources.limits import (
    MAX_CONTENT_TYPE_LENGTH,
    MAX_EVENT_TYPE_LENGTH,
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    MAX_MESSAGE_ID_LENGTH,
    check_headers,
    checked_content_type,
)
from service.store.errors import StoreOverloaded, StoreRefused, StoreUnavailable
from service.store.rejections import Rejection

log = logging.getLogger("service.ingest")

router = APIRouter(tags=["ingest"])


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


class DaprAnswer(BaseModel):
    status: str = Field(
        description="A `dapr` source's answer to its sidecar: `SUCCESS` (recorded, or a "
        "duplicate), `DROP` (can never be recorded: do not redeliver) or `RETRY`."
    )
    message_id: str | None = Field(default=None, description="The recorded message's id.")
    detail: str | None = Field(default=None, description="Why a delivery was dropped.")


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int, within_seconds: float) -> bytes:
    """The request body, refusing as soon as more than `limit` bytes are announced or read.

    Raises `TimeoutError` when the whole body has not arrived within `within_seconds`, so a
    client trickling its body cannot hold a request open indefinitely. Nothing here touches
    the database: a slow or vanished client never holds a connection.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async with asyncio.timeout(within_seconds):
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
    return b"".join(chunks)


class EscapedJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped. A handshake echoes the sender's own text
    (a challenge, a validation code), which may hold an unpaired surrogate: UTF-8 cannot
    encode one, but a JSON escape can."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


class AnswerResponse(EscapedJSONResponse):
    """A recorded delivery's JSON answer, encoded by orjson: Starlette's JSONResponse builds a
    new encoder for every answer (json.dumps with options), a cost paid per delivery.

    Made once a delivery, so its fields are set here rather than through `Response.__init__`
    and `init_headers`, which build the same status, body and two headers (Content-Length,
    Content-Type) by a longer way: 2.1 us against 1.3 here. tests/unit/test_answer_response.py
    holds it to what JSONResponse's own constructor makes.
    """

    def __init__(self, content: Any, status_code: int = 200) -> None:
        self.status_code = status_code
        self.background = None
        self.body = body = self.render(content)
        content_type = (b"content-type", b"application/json")
        if status_code < 200 or status_code in (204, 304):  # no length, as init_headers
            self.raw_headers = [content_type]
        else:
            self.raw_headers = [(b"content-length", str(len(body)).encode("latin-1")), content_type]

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except TypeError:  # a string orjson refuses (an unpaired surrogate): escape it
            return super().render(content)


def handshake_response(handshake: Handshake) -> Response:
    if isinstance(handshake.body, bytes | str):
        return PlainTextResponse(
            handshake.body, status_code=handshake.status, headers=dict(handshake.headers)
        )
    return EscapedJSONResponse(
        handshake.body, status_code=handshake.status, headers=dict(handshake.headers)
    )


INGEST_DESCRIPTION = f"""
Receives one delivery for the configured source `{{source}}`. The body is read as raw bytes
(at most `INBOX_MAX_BODY_BYTES`) and verified by the source's kind before anything parses it;
the message id is then recorded in the inbox, and the answer is sent only after that commit.

A redelivery of a recorded message id is answered 200 `duplicate` and changes nothing but the
message's `receive_count`. Errors are RFC 9457 problem documents and record nothing.

Every value stored is bounded, and refused with a problem naming the header or field: a message
id of at most {MAX_MESSAGE_ID_LENGTH} printable characters, an event type of at most
{MAX_EVENT_TYPE_LENGTH}, a content type of at most {MAX_CONTENT_TYPE_LENGTH} (else 400); at most
{MAX_HEADER_COUNT} headers, each at most {MAX_HEADER_BYTES} bytes with its name (else 431).
"""


@router.post(
    "/webhooks/{source}",
    summary="Receive a delivery",
    description=INGEST_DESCRIPTION,
    response_model=Accepted | BatchAccepted | DaprAnswer,
    responses={
        **problem_responses(400, 401, 404, 408, 413, 415, 431, 500, 503),
    },
    openapi_extra={
        # Which bytes are valid depends on the source's kind, so the schema promises none:
        # JSON kinds read an object (Event Grid and CloudEvents batches an array), and a
        # generic source that takes no id from the body accepts any bytes at all.
        "requestBody": {
            "required": True,
            "description": "The delivery exactly as the sender signed it: JSON for most "
            "kinds (an object, or an array for Event Grid and CloudEvents batches); any "
            "bytes for a generic source that reads nothing from the body.",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def receive(source: str, request: Request, state: StateDep) -> Response:
    started = time.perf_counter()
    work = handle_delivery(source, request, state, started)
    return await answered(state, source, request.headers.raw, started, work)


async def answered(
    state: AppState,
    source: str,
    raw_headers: list[tuple[bytes, bytes]],
    started: float,
    work: Coroutine[Any, Any, Response],
) -> Response:
    """`work`'s answer to a delivery, inside the delivery's span and timed by its metrics; a
    500 problem if it fails unexpectedly (nothing was recorded: the flusher's own errors
    reach it as exceptions before any 2xx)."""
    with tracing.delivery_span(source, raw_headers) as delivery:
        try:
            response = await work
        except Exception:
            log.exception("ingest failed", extra={"source": source})
            response = problem(500, "internal error; the delivery was not recorded")
        finally:
            label = source if source in state.inbox.sources else UNKNOWN_SOURCE
            state.metrics.ingest_finished(label, started)
        if delivery is not None:
            configured = state.inbox.sources.get(source)
            delivery.kind = configured.kind if configured is not None else ""
            delivery.status_code = response.status_code
        return response


PREFIX = "/webhooks/"


async def serve_ingest(state: AppState, scope: Scope, receive_: Receive, send: Send) -> bool:
    """Serve `/webhooks/{source}` directly, without FastAPI's middleware, routing and
    dependency machinery; False when `scope` is not an ingest request.

    Measured with bench/ingest: FastAPI's per-request layers cost more CPU than verifying and
    recording a delivery. `receive` and `handshake` stay registered as FastAPI routes, so
    /docs and /openapi.json describe them, and what this does not take (another method, a
    nested path) falls through to FastAPI's own answer. Under `serve`, most deliveries do
    not even come this way: the HTTP protocol hands them to `DirectIngest` (below).
    """
    path: str = scope["path"]
    if not path.startswith(PREFIX) or scope["type"] != "http":
        return False
    source = path[len(PREFIX) :]
    method = scope["method"]
    if not source or "/" in source or method not in ("POST", "OPTIONS"):
        return False
    request_id = request_id_of(scope["headers"])
    token = REQUEST_ID.set(request_id)
    try:
        request = Request(scope, receive_)
        if method == "POST":
            response = await receive(source, request, state)
        else:
            try:
                response = await handshake(source, request, state)
            except Exception:
                log.exception("handshake failed", extra={"source": source})
                response = problem(500, "internal error answering the handshake")
        response.headers["x-request-id"] = request_id
        await response(scope, receive_, send)
    finally:
        REQUEST_ID.reset(token)
    return True


NO_QUERY = QueryParams()  # immutable, so every delivery without a query string may share it


class DirectIngest:
    """`POST /webhooks/{source}` for the HTTP protocol itself (`service.api.http_protocol`),
    with no ASGI in between: the protocol has parsed the head and collected the body, and
    writes the answer it gets back.

    It takes only the plain case, which is nearly every delivery: a configured source, a
    Content-Length within the limit. Anything else (chunked bodies, `Expect`, an unknown or
    percent-encoded source, another method) goes the ASGI way, which answers the same: the
    verification, recording and answer are `take_delivery`'s in both.
    """

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.max_body_bytes = state.settings.max_body_bytes
        self.body_timeout_seconds = state.settings.body_timeout_seconds

    def takes(self, source: str) -> bool:
        return source in self.state.inbox.sources

    async def answer(
        self,
        source: str,
        raw_headers: list[tuple[bytes, bytes]],
        query_string: bytes,
        body: bytes,
        started: float,
    ) -> tuple[Response, str]:
        """The answer to a whole delivery, and its request id."""
        state = self.state
        request_id = request_id_of(raw_headers)
        token = REQUEST_ID.set(request_id)
        try:
            query = QueryParams(query_string) if query_string else NO_QUERY
            configured = state.inbox.sources[source]
            delivery = RawDelivery("POST", query, body, raw_headers)
            work = take_delivery(state, configured, delivery, started)
            return await answered(state, source, raw_headers, started, work), request_id
        finally:
            REQUEST_ID.reset(token)

    def body_timed_out(self, source: str, started: float) -> Response:
        return body_timed_out(self.state, source, started)

    def disconnected(self, source: str, started: float) -> None:
        log_delivery(self.state.metrics, source, None, "rejected:client_disconnect", started)


async def handle_delivery(
    source: str, request: Request, state: AppState, started: float
) -> Response:
    """A delivery that came through the ASGI app: find its source, read its body, take it."""
    configured = state.inbox.sources.get(source)
    if configured is None:
        return unknown_source(state.metrics, source, started)
    settings = state.settings
    metrics = state.metrics
    try:
        body = await read_body(request, settings.max_body_bytes, settings.body_timeout_seconds)
    except BodyTooLarge:
        log_delivery(metrics, source, None, "rejected:too_large", started)
        detail = f"body is larger than the limit of {settings.max_body_bytes} bytes"
        declared = request.headers.get("content-length", "")
        size = int(declared) if declared.isdigit() else settings.max_body_bytes + 1
        record_rejection(state, configured, request.headers.raw, 413, "too_large", detail, size)
        return problem(413, detail)
    except TimeoutError:
        return body_timed_out(state, source, started)
    except ClientDisconnect:
        log_delivery(metrics, source, None, "rejected:client_disconnect", started)
        return problem(400, "the client disconnected before sending the whole body")
    delivery = RawDelivery(request.method, request.query_params, body, request.headers.raw)
    return await take_delivery(state, configured, delivery, started)


def unknown_source(metrics: Metrics, source: str, started: float) -> Response:
    metrics.delivery(UNKNOWN_SOURCE, "rejected", "unknown_source")
    # Logged like every other delivery's outcome: a sender pointed at a mistyped source is
    # otherwise invisible to the operator.
    log.info(
        "delivery",
        extra={
            "source": loggable(source),
            "outcome": "rejected:unknown_source",
            "duration_ms": round((time.perf_counter() - started) * 1000, 2),
        },
    )
    return problem(404, f"no source named {loggable(source)!r} is configured")


def body_timed_out(state: AppState, source: str, started: float) -> Response:
    log_delivery(state.metrics, source, None, "rejected:body_timeout", started)
    seconds = state.settings.body_timeout_seconds
    return problem(408, f"the body did not arrive within {seconds} seconds")


async def take_delivery(
    state: AppState, configured: AnySource, delivery: RawDelivery, started: float
) -> Response:
    """Verify a delivery whose whole body has arrived, record its messages, answer it."""
    metrics = state.metrics
    source = configured.name
    body = delivery.body
    try:
        check_headers(delivery.raw_headers)
        content_type = checked_content_type(delivery.content_type)
        verdict = await configured.authenticate(delivery)
    except Rejected as exc:
        return refuse(state, configured, delivery, exc, started)
    if isinstance(verdict, Handshake):
        log_delivery(metrics, source, None, "handshake", started)
        return handshake_response(verdict)

    messages = tracing.traced_messages(configured.kind, verdict.items)
    pipeline = state.pipelines.get(source)
    kept = configured.stored_headers(delivery.raw_headers)
    try:
        if pipeline is not None and pipeline.sync:
            # Sync mode runs the handlers inside this request's own transaction, so it cannot
            # share a group commit with other requests.
            results = await record_and_process(
                state.engine, pipeline, messages, kept, body, content_type
            )
        else:
            results = await state.committer.record(
                source,
                messages,
                kept,
                body,
                content_type,
                processed=pipeline is not None and not pipeline.has_work,
                searchable=pipeline is not None and pipeline.search_payload,
            )
    except StoreRefused as exc:
        # The delivery's own values, not the database's health: a 4xx for this request only.
        refusal = BadDelivery(f"the database cannot store this delivery: {exc}")
        return refuse(state, configured, delivery, refusal, started)
    except StoreOverloaded:
        log_delivery(metrics, source, None, "unavailable:overloaded", started)
        return unavailable("too many deliveries are waiting for the database; nothing was recorded")
    except StoreUnavailable:
        log_delivery(metrics, source, None, "unavailable", started)
        return unavailable()
    except HandlerFailed as exc:
        log.error(
            "sync handler failed",
            exc_info=exc.__cause__,
            extra={"source": source, "message_id": exc.message_id},
        )
        log_delivery(metrics, source, exc.message_id, "failed:handler", started)
        retry = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.retry_after else None
        return problem(
            500,
            "a handler failed; nothing was recorded, so a redelivery runs it again",
            headers=retry,
        )
    for result in results:
        log_delivery(metrics, source, result.message_id, result.outcome, started)
    status, payload = configured.respond(results, verdict.batch)
    return AnswerResponse(payload, status_code=status)


def refuse(
    state: AppState, configured: AnySource, delivery: RawDelivery, exc: Rejected, started: float
) -> Response:
    """Answer a refused delivery: the kind's own answer if it has one, else the problem."""
    log_delivery(state.metrics, configured.name, None, f"rejected:{exc.reason}", started)
    if exc.status < 500:  # a sender's mistake, not the inbox's trouble
        size = len(delivery.body)
        record_rejection(
            state, configured, delivery.raw_headers, exc.status, exc.reason, exc.detail, size
        )
    answer = configured.answer_rejection(exc)
    if answer is not None:
        return handshake_response(answer)
    return problem(exc.status, exc.detail, title=exc.title)


# What is kept of a refused delivery's headers and problem: a sender chooses them, and a
# flood of them must not fill the table's rows either.
MAX_RECORDED_HEADERS = 64
MAX_RECORDED_TEXT = 512


def record_rejection(
    state: AppState,
    configured: AnySource,
    raw_headers: list[tuple[bytes, bytes]],
    status: int,
    reason: str,
    detail: str,
    size: int,
) -> None:
    """Keep a refused delivery for the operator (`store.rejections`): its headers redacted as
    a recorded message's are, never its body or query string."""
    headers = configured.stored_headers(raw_headers[:MAX_RECORDED_HEADERS])
    rejection = Rejection(
        source=configured.name,
        received_at=datetime.now(UTC),
        status=status,
        reason=reason,
        detail=detail[:MAX_RECORDED_TEXT],
        size=size,
        headers={k[:MAX_RECORDED_TEXT]: v[:MAX_RECORDED_TEXT] for k, v in headers.items()},
        request_id=REQUEST_ID.get(),
    )
    state.rejections.add(rejection)


@router.options(
    "/webhooks/{source}",
    summary="Answer a sender's handshake",
    description="The CloudEvents webhook abuse-protection handshake (`WebHook-Request-Origin`), "
    "for the kinds that speak it; 405 for the others. Records nothing.",
    status_code=200,
    responses={**problem_responses(404, 405)},
)
async def handshake(source: str, request: Request, state: StateDep) -> Response:
    configured = state.inbox.sources.get(source)
    if configured is None:
        return problem(404, f"no source named {source!r} is configured")
    delivery = RawDelivery(request.method, request.query_params, b"", request.headers.raw)
    try:
        answer = await configured.options(delivery)
    except Rejected as exc:
        log_delivery(state.metrics, source, None, f"rejected:{exc.reason}", time.perf_counter())
        return problem(exc.status, exc.detail, title=exc.title)
    if answer is None:
        return problem(
            405, f"source {source!r} answers no OPTIONS handshake", headers={"Allow": "POST"}
        )
    return handshake_response(answer)


MAX_LOGGED_SOURCE = 64


def loggable(name: str) -> str:
    """A source name from the URL as a log field: any sender can put anything there, so
    control and non-ASCII characters are escaped and a long one is cut."""
    cut = name[:MAX_LOGGED_SOURCE]
    escaped = cut.encode("ascii", "backslashreplace").decode("ascii")
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped)
    return escaped + ("..." if len(name) > MAX_LOGGED_SOURCE else "")


def log_delivery(
    metrics: Metrics, source: str, message_id: str | None, outcome: str, started: float
) -> None:
    """Log one delivery's outcome (`rejected:<reason>` for a refusal) and count it."""
    kind, _, reason = outcome.partition(":")
    metrics.delivery(source, kind, reason)
    tracing.delivery_outcome(message_id, outcome)
    fields: dict[str, Any] = {
        "source": source,
        "message_id": message_id,
        "outcome": outcome,
        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
    }
    info_event(log, "delivery", fields)
