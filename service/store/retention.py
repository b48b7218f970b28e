"""Retention's SQL: delete old finished rows in small batches that never wait on a lock."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.errors import translate_errors

# One batch: at most :batch rows, each in its own short transaction (their attempts go with
# them, by the statement trigger of migration 0007). SKIP LOCKED: a row ingest (a redelivery
# counting itself), the worker or an admin retry holds right now is left for the next pass, so
# pruning never blocks them and never deletes a row whose status is changing under it. Age is
# counted from the first receipt (`received_at`, indexed); the floor from the last one, since a
# sender still redelivering keeps the dedup window open from its latest try.
_DELETE_BATCH = """
    WITH doomed AS (
        SELECT id FROM inbox_messages
         WHERE status = ANY(:statuses)
           AND {source_clause}
           AND received_at < now() - make_interval(secs => CAST(:keep_seconds AS float8))
           AND last_received_at < now() - make_interval(secs => CAST(:floor_seconds AS float8))
         LIMIT :batch
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM inbox_messages m USING doomed WHERE m.id = doomed.id
    RETURNING m.status
"""
DELETE_FOR_SOURCE = text(_DELETE_BATCH.format(source_clause="source = :source"))
DELETE_FOR_OTHERS = text(_DELETE_BATCH.format(source_clause="source <> ALL(:configured)"))


async def delete_batch(
    engine: AsyncEngine,
    *,
    statuses: Sequence[str],
    keep_days: float,
    floor_days: float,
    batch: int,
    source: str | None = None,
    configured: Sequence[str] = (),
) -> list[str]:
    """Delete one batch of rows older than `keep_days` and outside the floor; their statuses.

    With `source`, only that source's rows; without, the rows of sources not in `configured`.
    """
    params = {
        "statuses": list(statuses),
        "keep_seconds": keep_days * 86_400,
        "floor_seconds": floor_days * 86_400,
        "batch": batch,
    }
    if source is not None:
        statement, params["source"] = DELETE_FOR_SOURCE, source
    else:
        statement, params["configured"] = DELETE_FOR_OTHERS, list(configured)
    async with translate_errors(), engine.begin() as conn:
        return [row.status for row in await conn.execute(statement, params)]
