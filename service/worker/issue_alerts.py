"""Alerts per issue: one notice to each `[alerts]` webhook when an issue opens (the first
failure of a new cause) or reopens (a resolved one fails again), whatever the number of
failures behind it.

Run by each webhook's dead-letter alert loop after its dead-letter pass, so it shares its
period, its delivery (format, retries) and its durability: the openings are read from the
database (service/store/issue_alerts.py), and one claimed but never delivered is sent again
after the interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.sources.config import AlertsConfig
from service.store.issue_alerts import IssueNotice, claim_issue_notices, mark_issue_notice_sent
from service.worker.alert_posts import post_with_retries, target_key

MAX_ERROR_CHARS = 300


def issue_notice_text(notice: IssueNotice) -> str:
    verb = "reopened" if notice.reopened else "opened"
    where = " / ".join(
        part
        for part in (
            f"destination `{notice.destination}`" if notice.destination else "",
            f"handler `{notice.handler}`" if notice.handler else "",
        )
        if part
    )
    error = (notice.sample_error or "no error recorded")[:MAX_ERROR_CHARS]
    plural = "attempt" if notice.failed_attempts == 1 else "attempts"
    return "\n".join(
        [
            f"webhook-inbox: issue `{notice.fingerprint}` {verb} on source `{notice.source}`"
            + (f", {where}" if where else "")
            + f": {notice.error_type}.",
            f"Sample error: {error}",
            f"{notice.failed_attempts} failed {plural} so far: "
            f"GET /admin/issues/{notice.fingerprint}",
        ]
    )


def issue_notice_body(notice: IssueNotice, format: str) -> dict[str, Any]:
    body: dict[str, Any] = {"text": issue_notice_text(notice)}
    if format == "json":
        body |= {
            "event": "issue_reopened" if notice.reopened else "issue_opened",
            "fingerprint": notice.fingerprint,
            "source": notice.source,
            "destination": notice.destination,
            "handler": notice.handler,
            "error_type": notice.error_type,
            "frame": notice.frame,
            "detail": notice.detail,
            "failed_attempts": notice.failed_attempts,
            "sample_error": notice.sample_error,
            "opened_at": notice.opened_at.isoformat(),
        }
    return body


async def alert_issues(
    engine: AsyncEngine,
    client: httpx.AsyncClient,
    url: str,
    config: AlertsConfig,
    sources: Sequence[str],
) -> int:
    """One pass for one webhook: the issue notices delivered."""
    notices = await claim_issue_notices(
        engine, target_key(url), sources, interval_seconds=config.interval_seconds
    )
    delivered = 0
    for notice in notices:
        fields = {
            "source": notice.source,
            "fingerprint": notice.fingerprint,
            "reopened": notice.reopened,
            "target": notice.target,
        }
        sent = await post_with_retries(
            client,
            url,
            issue_notice_body(notice, config.format),
            config,
            fields,
            what="issue alert",
            given_up="sent again after the interval",
        )
        if sent:
            await mark_issue_notice_sent(engine, notice)
            delivered += 1
    return delivered


async def issue_alert_pass(
    engine: AsyncEngine, client: httpx.AsyncClient, config: AlertsConfig, sources: Sequence[str]
) -> int:
    """One pass for every webhook (the worker runs it in each webhook's loop instead)."""
    total = 0
    for secret in config.webhooks:
        total += await alert_issues(engine, client, secret.get_secret_value(), config, sources)
    return total
