"""Alerts per issue's SQL: which issues opened or reopened since each target's last notice.

A target's row per issue (`inbox_issue_notices`) names the opening its notice tells of
(`first_seen`, or `reopened_at` once a resolved issue failed again). A pass first records every
newer opening of an announceable issue (open or acknowledged: an ignored one is never
announced), then claims the unsent rows under `FOR UPDATE SKIP LOCKED` and marks them claimed,
so two worker processes never send the same notice; `sent_at` is written only once the notice
was delivered, and a claim that never got there (a crash, an endpoint that keeps failing) is
due again after the interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.status import IssueStatus
from service.store.errors import translate_errors

ANNOUNCED = (IssueStatus.OPEN.value, IssueStatus.ACKNOWLEDGED.value)

# Compared per issue rather than against a time watermark: an upsert that commits late (its
# clock_timestamp() older than a pass that already ran) is still found by the next pass.
# The WHERE keeps an opening already recorded (claimed or sent) as it is.
RECORD_OPENINGS = text(
    """
    INSERT INTO inbox_issue_notices AS n (target, fingerprint, opened_at)
    SELECT :target, fingerprint, coalesce(reopened_at, first_seen)
      FROM inbox_issues
     WHERE source = ANY(CAST(:sources AS text[])) AND status = ANY(CAST(:announced AS text[]))
     ORDER BY fingerprint
        ON CONFLICT (target, fingerprint) DO UPDATE
       SET opened_at = excluded.opened_at, claimed_at = NULL, sent_at = NULL
     WHERE n.opened_at < excluded.opened_at
    """
)

# SKIP LOCKED: a notice another process is claiming right now is its to send.
CLAIM_DUE = text(
    """
    SELECT n.fingerprint, n.opened_at, n.opened_at > i.first_seen AS reopened, i.source,
           i.destination, i.handler, i.error_type, i.frame, i.detail, i.failed_attempts,
           i.sample_error
      FROM inbox_issue_notices AS n
      JOIN inbox_issues AS i ON i.fingerprint = n.fingerprint
     WHERE n.target = :target
       AND n.sent_at IS NULL
       AND (n.claimed_at IS NULL OR n.claimed_at <= now() - :interval * interval '1 second')
       AND i.status = ANY(CAST(:announced AS text[]))
     ORDER BY n.opened_at, n.fingerprint
     LIMIT :limit
       FOR UPDATE OF n SKIP LOCKED
    """
)

MARK_CLAIMED = text(
    """
    UPDATE inbox_issue_notices
       SET claimed_at = now()
     WHERE target = :target AND fingerprint = ANY(CAST(:fingerprints AS text[]))
    """
)

# Only the opening that was announced: one that came meanwhile stays due.
MARK_SENT = text(
    """
    UPDATE inbox_issue_notices
       SET sent_at = now()
     WHERE target = :target AND fingerprint = :fingerprint AND opened_at = :opened_at
    """
)


@dataclass(frozen=True)
class IssueNotice:
    """What one notice says about one issue's opening."""

    target: str
    fingerprint: str
    opened_at: datetime  # `first_seen`, or `reopened_at` when `reopened`
    reopened: bool
    source: str
    destination: str | None
    handler: str | None
    error_type: str
    frame: str | None
    detail: str | None
    failed_attempts: int
    sample_error: str | None


async def claim_issue_notices(
    engine: AsyncEngine,
    target: str,
    sources: Sequence[str],
    *,
    interval_seconds: float,
    limit: int = 20,
) -> list[IssueNotice]:
    """The issue notices due to `target` (the oldest openings first, at most `limit` a pass);
    each is marked claimed now (committed on return)."""
    announced = list(ANNOUNCED)
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(
            RECORD_OPENINGS, {"target": target, "sources": list(sources), "announced": announced}
        )
        rows = (
            await conn.execute(
                CLAIM_DUE,
                {
                    "target": target,
                    "interval": interval_seconds,
                    "announced": announced,
                    "limit": limit,
                },
            )
        ).all()
        if not rows:
            return []
        await conn.execute(
            MARK_CLAIMED, {"target": target, "fingerprints": [r.fingerprint for r in rows]}
        )
    return [
        IssueNotice(
            target,
            r.fingerprint,
            r.opened_at,
            bool(r.reopened),
            r.source,
            r.destination,
            r.handler,
            r.error_type,
            r.frame,
            r.detail,
            int(r.failed_attempts),
            r.sample_error,
        )
        for r in rows
    ]


async def mark_issue_notice_sent(engine: AsyncEngine, notice: IssueNotice) -> None:
    """The notice was delivered: this opening of the issue is announced to its target."""
    params = {
        "target": notice.target,
        "fingerprint": notice.fingerprint,
        "opened_at": notice.opened_at,
    }
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(MARK_SENT, params)
