"""Posting an alert to a webhook: what dead-letter and issue notices share (retries, backoff,
logs that name the webhook by its hash, never its URL)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import httpx

from service.sources.config import AlertsConfig

log = logging.getLogger("service.alerts")

# Backoff between tries of one notice within a pass: 1 s, 2 s, 4 s ... capped.
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0


def target_key(url: str) -> str:
    """The name a webhook's watermarks are stored under: never the URL, which is a secret."""
    return "sha256:" + hashlib.sha256(url.encode()).hexdigest()[:16]


async def post_with_retries(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    config: AlertsConfig,
    fields: dict[str, Any],
    *,
    what: str,
    given_up: str,
) -> bool:
    """POST `body`, trying `send_attempts` times with backoff; whether it was delivered. The
    logs say `what` was sent or failed, and `given_up` what becomes of it once every try did."""
    delay = FIRST_BACKOFF_SECONDS
    for attempt in range(1, config.send_attempts + 1):
        try:
            # httpx's timeout bounds each phase (connect, each read); this bounds the whole try,
            # against an endpoint that trickles its answer.
            async with asyncio.timeout(config.timeout_seconds):
                response = await client.post(url, json=body, timeout=config.timeout_seconds)
            if 200 <= response.status_code < 300:
                log.info(f"{what} sent", extra={**fields, "attempt": attempt})
                return True
            error = f"HTTP {response.status_code}"
        except (TimeoutError, httpx.TimeoutException) as exc:
            name = "Timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            error = f"{name}: no answer within {config.timeout_seconds:g} s"
        except httpx.HTTPError as exc:
            # httpx's transport errors are not known to name the URL; should one, it stays out
            # of the log.
            error = f"{type(exc).__name__}: {exc}".replace(url, target_key(url))
        log.warning(f"{what} failed", extra={**fields, "attempt": attempt, "error": error})
        if attempt < config.send_attempts:
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_SECONDS)
    log.error(
        f"{what} not delivered; {given_up}",
        extra={**fields, "retry_in_s": config.interval_seconds},
    )
    return False
