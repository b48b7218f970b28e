"""Forward destinations: POST a message to an internal HTTP endpoint and classify the answer."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import cache

import httpx
from standardwebhooks.webhooks import Webhook

from service.core import tracing
from service.core.schema import Status
from service.processing.attempt_spans import describe
from service.processing.fingerprints import forward_fingerprint, status_class
from service.processing.pipeline import Destination
from service.processing.policy import Failure, dead_failure, failed_attempt, retry_failure
from service.sources.config import EndpointConfig, SourceConfig
from service.store.results import DEFERRED, AttemptResult, MessageRow

log = logging.getLogger("service.forward")

# Besides 5xx: the request timed out, "too early", "too many requests" - all worth retrying.
RETRYABLE_STATUSES = frozenset({408, 425, 429})
MAX_RETRY_AFTER_SECONDS = 7 * 86_400
# "Too many requests" and "unavailable" with a valid `Retry-After`: the endpoint is up and says
# when to come back, so the message waits that long without spending an attempt (a throttle
# must not send messages to the dead letters). It waits at least a second, so that an endpoint
# answering `Retry-After: 0` for ever is not called in a loop, and at most an hour, so that a
# proxy's "come back tomorrow" is asked again within the hour. There is no count of deferrals:
# like an open breaker, an endpoint that throttles for ever holds its messages for ever, which
# an operator sees (last_error, the "forward deferred" log line, the oldest-pending age).
DEFERRING_STATUSES = frozenset({429, 503})
MIN_DEFERRAL_SECONDS = 1.0
MAX_DEFERRAL_SECONDS = 3600.0
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


@cache
def _signer(secret: str) -> Webhook:
    return Webhook(secret)


def endpoint_headers(row: MessageRow, endpoint: EndpointConfig) -> dict[str, str]:
    """The headers of an outgoing message's request (`service.outbox`): the stager's own, its
    key as `Idempotency-Key` and `webhook-id` (the same on every attempt, so that the
    receiver drops a repeat), and a `webhook-timestamp` of now with, when the endpoint has a
    secret, its Standard Webhooks `webhook-signature` (made at each attempt, so that a retry
    an hour later is still within the receiver's tolerance)."""
    now = datetime.now(UTC)
    headers = {
        **row.headers,
        "content-type": row.content_type or "application/octet-stream",
        "idempotency-key": row.message_id,
        "webhook-id": row.message_id,
        "webhook-timestamp": str(int(now.timestamp())),
    }
    if endpoint.secret is not None:
        signer = _signer(endpoint.secret.get_secret_value())
        headers["webhook-signature"] = signer.sign(row.message_id, now, row.body.decode())
    if row.trace_context:
        headers.update(row.trace_context)
    return headers


def deferral_seconds(response: httpx.Response) -> float | None:
    """How long a 429 or 503 asks the message to wait (its `Retry-After`, within the bounds
    above); None when the answer is not a deferral (any other status, or no valid header)."""
    if response.status_code not in DEFERRING_STATUSES:
        return None
    after = parse_retry_after(response.headers.get("retry-after"))
    if after is None:
        return None
    return min(max(after, MIN_DEFERRAL_SECONDS), MAX_DEFERRAL_SECONDS)


def response_error(response: httpx.Response) -> str:
    """A failed answer as last_error shows it: its status and the start of its body."""
    snippet = response.text[:ERROR_BODY_CHARS].strip()
    return f"HTTP {response.status_code}" + (f": {snippet}" if snippet else "")


def deferred_attempt(
    row: MessageRow,
    attempt: int,
    response: httpx.Response,
    wait: float,
    started: datetime,
    destination: str | None,
) -> AttemptResult:
    """The endpoint asked the message to wait `wait` seconds: it returns to the status it was
    claimed in, its attempt given back, with the answer as its last_error."""
    log.info(
        "forward deferred",
        extra={
            "source": row.source,
            "destination": destination,
            "message_id": row.message_id,
            "id": row.id,
            "attempt": attempt,
            "status_code": response.status_code,
            "retry_in_s": wait,
        },
    )
    return AttemptResult(
        row.id,
        attempt,
        row.status,
        DEFERRED,
        started,
        datetime.now(UTC),
        delay_seconds=wait,
        error_type="ForwardFailed",
        error=f"{response_error(response)} (Retry-After: waiting {wait:g}s, no attempt spent)",
        deferred=True,
        retry_after=True,
    )


def classify_response(
    response: httpx.Response, attempt: int, config: SourceConfig, budget_start: int = 0
) -> Failure | None:
    """None for 2xx; a retry for 408/425/429/5xx (and 1xx/3xx); dead for any other 4xx."""
    status = response.status_code
    if 200 <= status < 300:
        return None
    error = response_error(response)
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
    budget_start: int | None = None,
) -> AttemptResult:
    """POST `row` to the source's forward, or to the named `destination`'s; the attempt's
    result, never an exception: deferred when the endpoint asks it to wait
    (`deferral_seconds`). `attempt` and `budget_start`: the message's (its row's), or a named
    destination's own (`DestinationState`)."""
    forward = config.forward if destination is None else destination.forward
    assert forward is not None
    name = None if destination is None else destination.name
    budget_start = row.budget_start if budget_start is None else budget_start
    started = datetime.now(UTC)
    failure: Failure | None
    try:
        # httpx's timeout is per read/write; this one bounds the whole exchange, so the call
        # always ends before the lease does.
        async with asyncio.timeout(forward.timeout_seconds):
            headers = (
                endpoint_headers(row, forward)
                if isinstance(forward, EndpointConfig)
                else forward_headers(row, attempt, name)
            )
            response = await client.post(forward.url, content=row.body, headers=headers)
        wait = deferral_seconds(response)
        if wait is not None:
            return deferred_attempt(row, attempt, response, wait, started, name)
        failure = classify_response(response, attempt, config, budget_start)
        cause = status_class(response.status_code)
    except (TimeoutError, httpx.TimeoutException):
        cause = "timeout"
        failure = retry_failure(
            attempt,
            config,
            "ForwardTimeout",
            f"no answer within {forward.timeout_seconds:g}s",
            None,
            budget_start=budget_start,
        )
    except UnicodeDecodeError:
        # An outgoing message whose body is not UTF-8 text (staged by hand: `service.outbox`
        # refuses one) cannot be signed: no retry would sign it.
        cause = "unsignable"
        failure = dead_failure(
            "ForwardRejected",
            "the body is not UTF-8 text, which a Standard Webhooks signature needs",
        )
    except httpx.HTTPError as exc:
        cause = type(exc).__name__
        failure = retry_failure(
            attempt,
            config,
            "ForwardConnectionError",
            f"{type(exc).__name__}: {exc}",
            None,
            budget_start=budget_start,
        )
    finished = datetime.now(UTC)
    if failure is None:
        return AttemptResult(row.id, attempt, Status.PROCESSED, "processed", started, finished)
    # An outbox endpoint's messages (source `outbox:NAME`) name it; a URL's, its host and path.
    endpoint = row.source.removeprefix("outbox:") if isinstance(forward, EndpointConfig) else None
    cause_of = forward_fingerprint(
        row.source, name, failure.error_type, cause, forward.url, endpoint
    )
    failure = replace(failure, fingerprint=cause_of)
    log.warning(
        "forward failed",
        extra={
            "source": row.source,
            "destination": name,
            "message_id": row.message_id,
            "id": row.id,
            "attempt": attempt,
            "error": failure.error,
            "fingerprint": cause_of.key,
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
