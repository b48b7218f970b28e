"""Paused sources (0011): an operator's pause of a source's processing, and its resume.

A paused source's messages are not claimed (`claims.NOT_PAUSED`); its deliveries are still
accepted. The pause is a row, so it holds across restarts and for every process on the
database; the resume deletes it and wakes the workers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.errors import translate_errors
from service.store.notifications import NOTIFY

PAUSE = text(
    """
    INSERT INTO inbox_source_pauses AS p (source, operator, reason, actor)
    VALUES (:source, :operator, :reason, :actor)
        ON CONFLICT (source) DO UPDATE
       SET operator = excluded.operator, reason = excluded.reason, actor = excluded.actor
    RETURNING source, paused_at, operator, reason, actor
    """
)
RESUME = text(
    "DELETE FROM inbox_source_pauses WHERE source = :source "
    "RETURNING source, paused_at, operator, reason, actor"
)
PAUSES = text("SELECT source, paused_at, operator, reason, actor FROM inbox_source_pauses")


async def pause_source(
    engine: AsyncEngine, source: str, operator: str, reason: str, actor: str
) -> dict[str, Any]:
    """Pause `source` (again: the operator and reason are replaced, the time kept)."""
    async with translate_errors(), engine.begin() as conn:
        row = (
            await conn.execute(
                PAUSE, {"source": source, "operator": operator, "reason": reason, "actor": actor}
            )
        ).one()
    return dict(row._mapping)


async def resume_source(engine: AsyncEngine, source: str) -> dict[str, Any] | None:
    """Resume `source`: the pause it had, or None if it was not paused."""
    async with translate_errors(), engine.begin() as conn:
        row = (await conn.execute(RESUME, {"source": source})).one_or_none()
        if row is not None:
            await conn.execute(NOTIFY, {"source": source})
    return None if row is None else dict(row._mapping)


async def pauses(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    """Every paused source's pause, by source."""
    async with translate_errors(), engine.connect() as conn:
        return {r.source: dict(r._mapping) for r in await conn.execute(PAUSES)}
