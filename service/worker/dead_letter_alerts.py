"""Dead-letter alerts: a worker side task that tells `[alerts]` webhooks when messages go dead.

Durable rather than fed by the runner in memory: each pass reads the dead attempts since every
target's watermark from the database (service/store/dead_letter_alerts.py), so a notice that a
crash interrupted is sent by the next pass of any worker process, and the processing path
does nothing for alerts at all. Delivery is at least once: a crash between sending and moving
the watermark sends that notice again after the interval. Each webhook has its own loop, so one
that hangs or keeps failing delays only its own next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    start_watermarks,
)
from service.store.errors import StoreUnavailable
from service.worker.alert_posts import post_with_retries, target_key
from service.worker.issue_alerts import alert_issues

log = logging.getLogger("service.alerts")

# How long a pass waits between reading the newest attempt id and reading the dead attempts up
# to it, so that every attempt at or below that id has committed (see DEAD_SINCE).
SETTLE_SECONDS = 1.0
MAX_ERROR_CHARS = 300


def check_period(config: AlertsConfig) -> float:
    """How often a webhook's notices are looked for: half the interval, at most 5 s. A message
    that goes dead after a quiet spell is then announced within that and the settle second
    (about the interval, for one of 2 s), and a notice is at most that late once due."""
    return min(config.interval_seconds, 10.0) / 2


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
    fields = {"source": notice.source, "count": notice.count, "target": notice.target}
    return await post_with_retries(
        client,
        url,
        notice_body(notice, config.format),
        config,
        fields,
        what="dead-letter alert",
        given_up="its dead letters go in the next notice",
    )


def breaker_text(source: str, error: str | None, cooldown: float, destination: str = "") -> str:
    """The notice's text: of a source's own forward, or (`destination`) a named one's."""
    cause = (error or "no error recorded")[:MAX_ERROR_CHARS]
    which = (
        f"destination `{destination}` of source `{source}`"
        if destination
        else (f"the forward of source `{source}`")
    )
    shown = "GET /admin/destinations" if destination else "GET /admin/sources"
    return (
        f"webhook-inbox: {which} keeps failing ({cause}); its circuit is open: its messages "
        f"wait, spending no attempt, and a probe tries again in {cooldown:g} s. {shown} shows "
        "the breaker."
    )


async def send_breaker_notice(
    client: httpx.AsyncClient, config: AlertsConfig, text: str, fields: dict[str, Any]
) -> None:
    """POST a circuit-breaker notice to every alert webhook, one try each (best effort: the
    breaker's state stays in the admin API and /metrics whatever happens to the notice)."""
    for secret in config.webhooks:
        url = secret.get_secret_value()
        body: dict[str, Any] = {"text": text}
        if config.format == "json":
            body |= {"event": "breaker_opened", **fields}
        try:
            async with asyncio.timeout(config.timeout_seconds):
                response = await client.post(url, json=body, timeout=config.timeout_seconds)
            outcome = f"HTTP {response.status_code}"
        except (TimeoutError, httpx.HTTPError) as exc:
            outcome = type(exc).__name__
        log.info(
            "circuit-breaker alert posted",
            extra={**fields, "target": target_key(url), "outcome": outcome},
        )


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
    """One pass for every webhook at once (the worker runs one loop per webhook instead, see
    `alert_periodically`); the notices delivered."""
    settled = await last_attempt_id(engine)
    await asyncio.sleep(settle_seconds)
    urls = [url.get_secret_value() for url in config.webhooks]
    counts = await asyncio.gather(
        *(alert_target(engine, client, url, config, sources, settled, metrics) for url in urls)
    )
    return sum(counts)


async def start_alerts(engine: AsyncEngine, config: AlertsConfig, sources: Sequence[str]) -> None:
    """For the worker, before its claim loops start: each webhook's watermarks start at the
    newest attempt, so that every message this worker kills is announced, however soon after
    start-up. (Written at the first pass instead, they would start past the messages that went
    dead during that pass's settle second, and those would never be announced.) With the
    database down, the first pass that reaches it writes them."""
    targets = [target_key(url.get_secret_value()) for url in config.webhooks]
    try:
        await start_watermarks(engine, targets, sources)
    except StoreUnavailable as exc:
        log.warning(
            "dead-letter alerts' watermarks not written at start: database unavailable; the "
            "first pass writes them",
            extra={"error": str(exc)},
        )


async def alert_target_periodically(
    engine: AsyncEngine,
    client: httpx.AsyncClient,
    url: str,
    config: AlertsConfig,
    sources: Sequence[str],
    stop: asyncio.Event,
    *,
    period: float,
    settle_seconds: float,
    metrics: Metrics | None,
) -> None:
    """One webhook's passes, one starting every `period` (at once after one that took longer)
    until `stop`: a pass that fails is logged and the next one tries again."""
    target = target_key(url)
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        began = loop.time()
        try:
            settled = await last_attempt_id(engine)
            await asyncio.sleep(settle_seconds)
            await alert_target(engine, client, url, config, sources, settled, metrics)
            await alert_issues(engine, client, url, config, sources)
        except StoreUnavailable as exc:
            log.warning(
                "dead-letter alerts skipped: database unavailable",
                extra={"target": target, "error": str(exc)},
            )
        except Exception:
            log.exception(
                "dead-letter alert pass failed; the next pass tries again",
                extra={"target": target},
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, began + period - loop.time()))


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
    """For the worker: for each webhook, a pass every `check_seconds` until `stop`. Each
    webhook in a loop of its own: a pass waits for its notices' tries (up to `send_attempts`
    timeouts and the backoff between them), and a webhook that hangs must not put off the
    others' notices. Alerts never stop the worker that processes messages: the notices are in
    the database, so nothing is lost meanwhile."""
    period = check_seconds if check_seconds is not None else check_period(config)
    urls = [url.get_secret_value() for url in config.webhooks]
    async with httpx.AsyncClient(follow_redirects=False) as client:
        await asyncio.gather(
            *(
                alert_target_periodically(
                    engine,
                    client,
                    url,
                    config,
                    sources,
                    stop,
                    period=period,
                    settle_seconds=settle_seconds,
                    metrics=metrics,
                )
                for url in urls
            )
        )
