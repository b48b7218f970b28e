"""Dead-letter alerts' SQL: which messages went dead since each target's watermark.

A watermark is the id of the last dead attempt (`inbox_attempts.outcome = 'dead'`) a target
was told about, per source. A pass claims a target's sources whose last notice is older than
the interval (`notified_at`, under `FOR UPDATE SKIP LOCKED`, so two worker processes never
claim the same one), and the watermark moves only once a notice was delivered: a crash or an
endpoint that keeps failing leaves the dead letters to the next notice, never drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.errors import translate_errors

LAST_ATTEMPT_ID = text("SELECT coalesce(max(id), 0) FROM inbox_attempts")

# A new (target, source) starts at the newest attempt: dead letters from before alerts were
# configured are not announced. A worker writes them before its claim loops start
# (`start_watermarks`), so none of its own attempts can fall behind the start; DO NOTHING: a
# watermark already there (another process's, or an earlier run's) is kept.
START_WATERMARKS = text(
    """
    INSERT INTO inbox_alert_watermarks (target, source, last_attempt_id)
    SELECT t, s, (SELECT coalesce(max(id), 0) FROM inbox_attempts)
      FROM unnest(CAST(:targets AS text[])) AS t, unnest(CAST(:sources AS text[])) AS s
    ON CONFLICT (target, source) DO NOTHING
    """
)

# SKIP LOCKED: a source another process is claiming right now is its to announce.
DUE_WATERMARKS = text(
    """
    SELECT source, last_attempt_id
      FROM inbox_alert_watermarks
     WHERE target = :target
       AND source = ANY(CAST(:sources AS text[]))
       AND (notified_at IS NULL OR notified_at <= now() - :interval * interval '1 second')
     ORDER BY source
       FOR UPDATE SKIP LOCKED
    """
)

# Dead attempts after each watermark, up to `settled`: an attempt id is assigned just before
# its transaction commits, so one at or below an id read a moment ago has committed by now,
# and a smaller id can no longer appear behind a watermark that has moved past it.
DEAD_SINCE = text(
    """
    SELECT w.source, a.id AS attempt_id, m.id, m.message_id, a.attempt, a.error_type, a.error,
           a.finished_at,
           row_number() OVER (PARTITION BY w.source ORDER BY a.id) AS n,
           count(*) OVER (PARTITION BY w.source) AS total,
           max(a.id) OVER (PARTITION BY w.source) AS up_to
      FROM unnest(CAST(:sources AS text[]), CAST(:after AS bigint[])) AS w(source, after)
      JOIN inbox_attempts AS a ON a.id > w.after AND a.id <= :settled AND a.outcome = 'dead'
      JOIN inbox_messages AS m ON m.id = a.message_id AND m.source = w.source
     ORDER BY w.source, a.id
    """
)

MARK_NOTIFIED = text(
    """
    UPDATE inbox_alert_watermarks
       SET notified_at = now()
     WHERE target = :target AND source = ANY(CAST(:sources AS text[]))
    """
)

ADVANCE = text(
    """
    UPDATE inbox_alert_watermarks
       SET last_attempt_id = :up_to
     WHERE target = :target AND source = :source AND last_attempt_id < :up_to
    """
)


@dataclass(frozen=True)
class DeadLetter:
    id: int
    message_id: str
    attempt: int
    error: str | None
    finished_at: datetime | None


@dataclass(frozen=True)
class DeadLetterNotice:
    """What one notice says about one source: how many went dead, and the first of them."""

    target: str
    source: str
    count: int
    up_to: int  # the watermark once this notice is delivered
    first: list[DeadLetter] = field(default_factory=list)


async def last_attempt_id(engine: AsyncEngine) -> int:
    async with translate_errors(), engine.connect() as conn:
        return int((await conn.execute(LAST_ATTEMPT_ID)).scalar_one())


async def start_watermarks(
    engine: AsyncEngine, targets: Sequence[str], sources: Sequence[str]
) -> None:
    """Each (target, source) without a watermark starts at the newest attempt."""
    params = {"targets": list(targets), "sources": list(sources)}
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(START_WATERMARKS, params)


async def claim_notices(
    engine: AsyncEngine,
    target: str,
    sources: Sequence[str],
    *,
    interval_seconds: float,
    max_errors: int,
    settled: int,
) -> list[DeadLetterNotice]:
    """The notices due to `target`, one per source with dead letters since its watermark and
    no notice within `interval_seconds`; each is marked notified now (committed on return)."""
    async with translate_errors(), engine.begin() as conn:
        # Here too, for a process that could not write them at start (the database was down).
        await conn.execute(START_WATERMARKS, {"targets": [target], "sources": list(sources)})
        due = (
            await conn.execute(
                DUE_WATERMARKS,
                {"target": target, "sources": list(sources), "interval": interval_seconds},
            )
        ).all()
        if not due:
            return []
        rows = (
            await conn.execute(
                DEAD_SINCE,
                {
                    "sources": [r.source for r in due],
                    "after": [r.last_attempt_id for r in due],
                    "settled": settled,
                },
            )
        ).all()
        notices: dict[str, DeadLetterNotice] = {}
        for row in rows:
            notice = notices.get(row.source)
            if notice is None:
                notice = DeadLetterNotice(target, row.source, int(row.total), int(row.up_to))
                notices[row.source] = notice
            if row.n <= max_errors:
                error = f"{row.error_type}: {row.error}" if row.error_type else row.error
                notice.first.append(
                    DeadLetter(row.id, row.message_id, row.attempt, error, row.finished_at)
                )
        if notices:
            await conn.execute(MARK_NOTIFIED, {"target": target, "sources": list(notices)})
    return list(notices.values())


async def advance_watermark(engine: AsyncEngine, notice: DeadLetterNotice) -> None:
    """The notice was delivered: its dead letters are announced."""
    params = {"target": notice.target, "source": notice.source, "up_to": notice.up_to}
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(ADVANCE, params)
