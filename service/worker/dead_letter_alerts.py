"""Dead-letter alerts: a worker side task that tells `[alerts]` webhooks when messages go dead.

Durable rather than fed by the runner in memory: each pass reads the dead attempts since every
target's watermark from the database (service/store/dead_letter_alerts.py), so a notice that a
crash interrupted is sent by the next pass of any worker process, and the processing path
does nothing for alerts at all. Delivery is at least once: a crash between sending and moving
the watermark sends that notice again after the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.metrics import Metrics
from service.sources.config import AlertsConfig
from service.store.dead_letter_alerts import (
    DeadLetterNotice,
    advance_watermark,
    claim_notices,
    last_attempt_id,
)
from service.store.errors import StoreUnavailable

log = logging.getLogger("service.alerts")

# How long a pass waits between reading the newest attempt id and reading the dead attempts up
# to it, so that every attempt at or below that id has committed (see DEAD_SINCE).
SETTLE_SECONDS = 1.0
# Backoff between tries of one notice within a pass: 1 s, 2 s, 4 s ... capped.
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
MAX_ERROR_CHARS = 300


def target_key(url: str) -> str:
    """The name a webhook's watermarks are stored under: never the URL, which is a secret."""
    return "sha256:" + hashlib.sha256(url.encode()).hexdigest()[:16]


def notice_text(notice: DeadLetterNotice) -> str:
    plural = "message" if notice.count == 1 else "messages"
    lines = [f"webhook-inbox: {notice.count} {plural} of source `{notice.source}` went dead."]
    if notice.first:
        lines.append("First errors:" if len(notice.first) > 1 else "Error:")
    for dead in notice.first:
        error = (dead.error or "no error recorded")[:MAX_ERROR_CHARS]
        lines.append(
            f"• message `{dead.message_id}` (inbox id {dead.id}, attempt {dead.attempt}): {error}"
        )
    more = notice.count - len(notice.first)
    if more > 0:
        lines.append(f"…and {more} more: GET /admin/dead-letters?source={notice.source}")
    return "\n".join(lines)


def notice_body(notice: DeadLetterNotice, format: str) -> dict[str, Any]:
    body: dict[str, Any] = {"text": notice_text(notice)}
    if format == "json":
        body |= {
            "source": notice.source,
            "count": notice.count,
            "messages": [
                {
                    "id": d.id,
                    "message_id": d.message_id,
                    "attempt": d.attempt,
                    "error": d.error,
                    "finished_at": d.finished_at.isoformat() if d.finished_at else None,
                }
                for d in notice.first
            ],
        }
    return body


async def send_notice(
    client: httpx.AsyncClient, url: str, notice: DeadLetterNotice, config: AlertsConfig
) -> bool:
    """POST the notice, trying `send_attempts` times with backoff; whether it was delivered."""
    body = notice_body(notice, config.format)
    fields = {"source": notice.source, "count": notice.count, "target": notice.target}
    delay = FIRST_BACKOFF_SECONDS
    for attempt in range(1, config.send_attempts + 1):
        try:
            response = await client.post(url, json=body, timeout=config.timeout_seconds)
            if 200 <= response.status_code < 300:
                log.info("dead-letter alert sent", extra={**fields, "attempt": attempt})
                return True
            error = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        log.warning(
            "dead-letter alert failed",
            extra={**fields, "attempt": attempt, "error": error},
        )
        if attempt < config.send_attempts:
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_SECONDS)
    log.error(
        "dead-letter alert not delivered; its dead letters go in the next notice",
        extra={**fields, "retry_in_s": config.interval_seconds},
    )
    return False


async def alert_target(
    engine: AsyncEngine,
    client: httpx.AsyncClient,
    url: str,
    config: AlertsConfig,
    sources: Sequence[str],
    settled: int,
    metrics: Metrics | None = None,
) -> int:
    """One pass for one webhook: the notices delivered."""
    notices = await claim_notices(
        engine,
        target_key(url),
        sources,
        interval_seconds=config.interval_seconds,
        max_errors=config.max_errors,
        settled=settled,
    )
    delivered = 0
    for notice in notices:
        sent = await send_notice(client, url, notice, config)
        if metrics is not None:
            metrics.alert_notices.labels("sent" if sent else "failed").inc()
        if sent:
            await advance_watermark(engine, notice)
            delivered += 1
    return delivered


async def alert_pass(
    engine: AsyncEngine,
    client: httpx.AsyncClient,
    config: AlertsConfig,
    sources: Sequence[str],
    *,
    settle_seconds: float = SETTLE_SECONDS,
    metrics: Metrics | None = None,
) -> int:
    """Every webhook's due notices, the webhooks side by side; the notices delivered."""
    settled = await last_attempt_id(engine)
    await asyncio.sleep(settle_seconds)
    urls = [url.get_secret_value() for url in config.webhooks]
    counts = await asyncio.gather(
        *(alert_target(engine, client, url, config, sources, settled, metrics) for url in urls)
    )
    return sum(counts)


async def alert_periodically(
    engine: AsyncEngine,
    config: AlertsConfig,
    sources: Sequence[str],
    stop: asyncio.Event,
    *,
    check_seconds: float | None = None,
    settle_seconds: float = SETTLE_SECONDS,
    metrics: Metrics | None = None,
) -> None:
    """For the worker: a pass every `check_seconds` (default: the interval, at most 10 s)
    until `stop`. A pass that fails, for whatever reason, is logged and the next one tries
    again: alerts must never stop the worker that processes messages (the notices are in the
    database, so nothing is lost meanwhile)."""
    period = check_seconds if check_seconds is not None else min(config.interval_seconds, 10.0)
    async with httpx.AsyncClient(follow_redirects=False) as client:
        while not stop.is_set():
            try:
                await alert_pass(
                    engine, client, config, sources, settle_seconds=settle_seconds, metrics=metrics
                )
            except StoreUnavailable as exc:
                log.warning(
                    "dead-letter alerts skipped: database unavailable", extra={"error": str(exc)}
                )
            except Exception:
                log.exception("dead-letter alert pass failed; the next pass tries again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=period)
