"""Forward destinations: POST a message to an internal HTTP endpoint and classify the answer."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from service.core import tracing
from service.core.schema import Status
from service.processing.attempt_spans import describe
from service.processing.pipeline import Destination
from service.processing.policy import Failure, dead_failure, failed_attempt, retry_failure
from service.sources.config import SourceConfig
from service.store.claims import AttemptResult, MessageRow

log = logging.getLogger("service.forward")

# Besides 5xx: the request timed out, "too early", "too many requests" - all worth retrying.
RETRYABLE_STATUSES = frozenset({408, 425, 429})
MAX_RETRY_AFTER_SECONDS = 7 * 86_400
# How much of an error response's body to keep in last_error.
ERROR_BODY_CHARS = 300


def lease_seconds(config: SourceConfig, margin: float) -> float:
    """How long a forward may hold its message before another worker takes it again: its
    timeout, or the longest of its named destinations' (called at once), and the margin."""
    forwards = [config.forward] + [d.forward for d in config.destinations.values()]
    return max((f.timeout_seconds for f in forwards if f is not None), default=0.0) + margin


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_SECONDS)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def forward_headers(
    row: MessageRow, attempt: int, destination: str | None = None
) -> dict[str, str]:
    # The same on every attempt, so the destination can drop a repeat of an attempt whose
    # answer we never saw (timeout, crash before recording it); a named destination's adds
    # its name, so two destinations on one endpoint are two deliveries.
    key = f"{row.source}:{row.message_id}"
    headers = {
        "content-type": row.content_type or "application/octet-stream",
        "idempotency-key": key if destination is None else f"{key}:{destination}",
        "inbox-message-id": str(row.id),
        "inbox-attempt": str(attempt),
        "inbox-source": row.source,
    }
    if destination is not None:
        headers["inbox-destination"] = destination
    if row.event_type is not None:
        headers["inbox-event-type"] = row.event_type
    if row.trace_context:
        # The delivery's stored trace context (`traceparent`, `tracestate`), so the destination
        # continues the sender's trace; with tracing on, the httpx instrumentation replaces it
        # with the attempt's own span.
        headers.update(row.trace_context)
    return headers


def classify_response(
    response: httpx.Response, attempt: int, config: SourceConfig, budget_start: int = 0
) -> Failure | None:
    """None for 2xx; a retry for 408/425/429/5xx (and 1xx/3xx); dead for any other 4xx."""
    status = response.status_code
    if 200 <= status < 300:
        return None
    snippet = response.text[:ERROR_BODY_CHARS].strip()
    error = f"HTTP {status}" + (f": {snippet}" if snippet else "")
    if 400 <= status < 500 and status not in RETRYABLE_STATUSES:
        return dead_failure("ForwardRejected", error)
    after = parse_retry_after(response.headers.get("retry-after"))
    return retry_failure(attempt, config, "ForwardFailed", error, after, budget_start=budget_start)


async def forward_message(
    client: httpx.AsyncClient,
    row: MessageRow,
    attempt: int,
    config: SourceConfig,
    *,
    destination: Destination | None = None,
) -> AttemptResult:
    """POST `row` to the source's forward, or to the named `destination`'s; the attempt's
    result, never an exception."""
    forward = config.forward if destination is None else destination.forward
    assert forward is not None
    name = None if destination is None else destination.name
    started = datetime.now(UTC)
    failure: Failure | None
    try:
        # httpx's timeout is per read/write; this one bounds the whole exchange, so the call
        # always ends before the lease does.
        async with asyncio.timeout(forward.timeout_seconds):
            response = await client.post(
                forward.url, content=row.body, headers=forward_headers(row, attempt, name)
            )
        failure = classify_response(response, attempt, config, row.budget_start)
    except (TimeoutError, httpx.TimeoutException):
        failure = retry_failure(
            attempt,
            config,
            "ForwardTimeout",
            f"no answer within {forward.timeout_seconds:g}s",
            None,
            budget_start=row.budget_start,
        )
    except httpx.HTTPError as exc:
        failure = retry_failure(
            attempt,
            config,
            "ForwardConnectionError",
            f"{type(exc).__name__}: {exc}",
            None,
            budget_start=row.budget_start,
        )
    finished = datetime.now(UTC)
    if failure is None:
        return AttemptResult(row.id, attempt, Status.PROCESSED, "processed", started, finished)
    log.warning(
        "forward failed",
        extra={
            "source": row.source,
            "destination": name,
            "message_id": row.message_id,
            "id": row.id,
            "attempt": attempt,
            "error": failure.error,
            "next_status": failure.status,
            "retry_in_s": failure.delay_seconds,
        },
    )
    return failed_attempt(row.id, attempt, failure, started, finished)


async def forward_message_traced(
    client: httpx.AsyncClient, row: MessageRow, attempt: int, config: SourceConfig
) -> AttemptResult:
    """`forward_message` inside the attempt's span; the httpx instrumentation then sends the
    span's `traceparent` to the destination."""
    if not tracing.enabled():
        return await forward_message(client, row, attempt, config)
    target = [config.forward.url] if config.forward else []
    with tracing.attempt_span(
        row.source, row.message_id, row.id, attempt, target, row.trace_context
    ) as span:
        result = await forward_message(client, row, attempt, config)
        if span is not None:
            span.finished(result.outcome, describe(result))
    return result
