"""Issues: one row per cause of failure (`inbox_issues`, keyed by the attempts' fingerprint),
counted in the transaction that records the failed attempts, and listed for the operator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.status import IssueStatus, Status
from service.store.admin import (
    FAILED_WITH,
    LAST_FINGERPRINT,
    SUMMARY_COLUMNS,
    BulkRetryResult,
    MessageFilter,
    bulk_retry,
)
from service.store.errors import translate_errors

# One statement per batch, whatever its failures: they arrive counted by fingerprint
# (`store.attempts.issues_document`). A
# resolved issue that fails again is open again (reopened_at); acknowledged and ignored ones
# keep their status. The rows go in fingerprint order: two batches upserting the same issues
# then lock them in the same order, so they wait for each other instead of deadlocking.
RECORD_ISSUES = f"""
    INSERT INTO inbox_issues AS i (fingerprint, source, destination, handler, error_type,
                                   frame, detail, status, first_seen, last_seen,
                                   failed_attempts, sample_error, sample_traceback)
    SELECT fingerprint, source, destination, handler, error_type, frame, detail,
           '{IssueStatus.OPEN.value}', clock_timestamp(), clock_timestamp(), failed, error,
           traceback
      FROM json_to_recordset($1::json) AS v(
               fingerprint text, source text, destination text, handler text, error_type text,
               frame text, detail text, failed bigint, error text, traceback text)
     ORDER BY fingerprint
        ON CONFLICT (fingerprint) DO UPDATE
       SET last_seen = excluded.last_seen,
           failed_attempts = i.failed_attempts + excluded.failed_attempts,
           sample_error = excluded.sample_error,
           sample_traceback = coalesce(excluded.sample_traceback, i.sample_traceback),
           status = CASE WHEN i.status = '{IssueStatus.RESOLVED.value}'
                         THEN '{IssueStatus.OPEN.value}' ELSE i.status END,
           reopened_at = CASE WHEN i.status = '{IssueStatus.RESOLVED.value}'
                              THEN excluded.last_seen ELSE i.reopened_at END
"""  # noqa: S608 - fixed values, no input

# The issues, most recently failing first, and of each the messages now retrying and dead whose
# latest failed attempt has its fingerprint (the attempts' index by message, newest first,
# finds that attempt; only unfinished and dead messages are looked at).
LIST_ISSUES = text(
    f"""
    WITH listed AS (
        SELECT *
          FROM inbox_issues
         WHERE (CAST(:source AS text) IS NULL OR source = :source)
           AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
           AND (CAST(:fingerprint AS text) IS NULL OR fingerprint = :fingerprint)
         ORDER BY last_seen DESC, fingerprint
         LIMIT :limit
    ), latest AS (
        SELECT m.status, f.fingerprint
          FROM inbox_messages AS m
         CROSS JOIN LATERAL (
                SELECT a.fingerprint
                  FROM inbox_attempts AS a
                 WHERE a.message_id = m.id AND a.fingerprint IS NOT NULL
                 ORDER BY a.id DESC
                 LIMIT 1) AS f
         WHERE m.status IN ('{Status.RETRYING.value}', '{Status.DEAD.value}')
           AND m.source IN (SELECT source FROM listed)
    )
    SELECT listed.*,
           (SELECT count(*) FROM latest
             WHERE latest.fingerprint = listed.fingerprint
               AND latest.status = '{Status.RETRYING.value}') AS retrying,
           (SELECT count(*) FROM latest
             WHERE latest.fingerprint = listed.fingerprint
               AND latest.status = '{Status.DEAD.value}') AS dead
      FROM listed
     ORDER BY last_seen DESC, fingerprint
    """  # noqa: S608 - fixed values, no input
)


async def list_issues(
    engine: AsyncEngine,
    source: str | None,
    statuses: Sequence[IssueStatus] | None,
    limit: int,
) -> list[dict[str, Any]]:
    """The issues, most recent `last_seen` first, with the counts of their messages now
    `retrying` and `dead`."""
    params = {
        "source": source,
        "statuses": [s.value for s in statuses] if statuses else None,
        "limit": limit,
        "fingerprint": None,
    }
    async with translate_errors(), engine.connect() as conn:
        return [dict(row._mapping) for row in await conn.execute(LIST_ISSUES, params)]


class IssueNotFound(LookupError):
    """No issue has that fingerprint."""


# An issue's messages, newest first: those whose latest failed attempt has its fingerprint, in
# any status (a retried one that was processed since is still shown, as its history). The
# fingerprint's partial index (0023) finds the candidates among its failed attempts.
ISSUE_MESSAGES = text(
    f"""
    SELECT {SUMMARY_COLUMNS}
      FROM inbox_messages
     WHERE id IN ({FAILED_WITH}) AND ({LAST_FINGERPRINT}) = :fingerprint
     ORDER BY received_at DESC, id DESC
     LIMIT :limit
    """  # noqa: S608 - fixed clauses, bound values
)


async def get_issue(engine: AsyncEngine, fingerprint: str, limit: int) -> dict[str, Any]:
    """The issue as listed, and its newest `limit` messages (`messages`)."""
    issue = await get_issue_summary(engine, fingerprint)
    async with translate_errors(), engine.connect() as conn:
        messages = await conn.execute(ISSUE_MESSAGES, {"fingerprint": fingerprint, "limit": limit})
        return {**issue, "messages": [dict(m._mapping) for m in messages]}


# An operator's decision on an issue. `acknowledged_by` is whoever took the last decision and
# `note` their latest word: a decision without a note keeps the one before. The worker's own
# change (a resolved issue failing again is open again) is RECORD_ISSUES's.
SET_STATUS = text(
    """
    UPDATE inbox_issues
       SET status = :status, acknowledged_by = :operator, note = coalesce(:note, note)
     WHERE fingerprint = :fingerprint
 RETURNING fingerprint
    """
)


async def set_issue_status(
    engine: AsyncEngine, fingerprint: str, status: IssueStatus, operator: str, note: str | None
) -> dict[str, Any]:
    """Set the issue's status, by `operator`, with their `note` if any; the issue as listed."""
    params = {"status": status.value, "operator": operator, "note": note}
    async with translate_errors(), engine.begin() as conn:
        changed = await conn.execute(SET_STATUS, {**params, "fingerprint": fingerprint})
        if changed.first() is None:
            raise IssueNotFound(fingerprint)
    return await get_issue_summary(engine, fingerprint)


async def get_issue_summary(engine: AsyncEngine, fingerprint: str) -> dict[str, Any]:
    """The issue as listed, with its counts of messages now retrying and dead."""
    params = {"source": None, "statuses": None, "limit": 1, "fingerprint": fingerprint}
    async with translate_errors(), engine.connect() as conn:
        row = (await conn.execute(LIST_ISSUES, params)).first()
    if row is None:
        raise IssueNotFound(fingerprint)
    return dict(row._mapping)


async def resolve_and_retry(
    engine: AsyncEngine, fingerprint: str, operator: str | None, actor: str, *, dry_run: bool
) -> BulkRetryResult:
    """Retry the issue's dead messages (those whose latest failed attempt has its fingerprint)
    with a fresh budget, through the bulk retry; `dry_run` only counts them.

    The issue is resolved first, so that a message failing again of the same cause reopens it
    rather than failing under a status set after it."""
    issue = await get_issue_summary(engine, fingerprint)
    filters = MessageFilter(
        source=issue["source"], statuses=(Status.DEAD,), fingerprint=fingerprint
    )
    if not dry_run:
        await set_issue_status(engine, fingerprint, IssueStatus.RESOLVED, operator or actor, None)
    return await bulk_retry(engine, filters, actor, force=False, dry_run=dry_run)


# The metrics' read (`/metrics`, at scrape time): issues by source and status, and the failed
# attempts of the newest open or acknowledged ones. Bounded so that a flood of new causes
# cannot flood Prometheus with series: one per fingerprint, the most recently failing first.
MAX_ISSUE_SERIES = 100
ISSUES_BY_STATUS = text("SELECT source, status, count(*) AS n FROM inbox_issues GROUP BY 1, 2")
ACTIVE_ISSUES = text(
    f"""
    SELECT fingerprint, source, failed_attempts
      FROM inbox_issues
     WHERE status IN ('{IssueStatus.OPEN.value}', '{IssueStatus.ACKNOWLEDGED.value}')
     ORDER BY last_seen DESC, fingerprint
     LIMIT :limit
    """  # noqa: S608 - fixed values, no input
)


async def issue_counts(
    engine: AsyncEngine,
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """Issues by (source, status), and the failed attempts by (fingerprint, source) of the
    `MAX_ISSUE_SERIES` most recently failing open or acknowledged issues."""
    async with translate_errors(), engine.connect() as conn:
        by_status = {(r.source, r.status): int(r.n) for r in await conn.execute(ISSUES_BY_STATUS)}
        active = await conn.execute(ACTIVE_ISSUES, {"limit": MAX_ISSUE_SERIES})
        failed = {(r.fingerprint, r.source): int(r.failed_attempts) for r in active}
    return by_status, failed
