"""Token buckets of the rate-limited sources (0013), shared by every process on the database."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.errors import translate_errors

# Refill the bucket for the time since it was last touched (up to `burst`), then take up to
# `want` whole tokens; a source's first take finds it full. One row, locked for the moment of
# the statement: processes taking at once queue on it and each sees what the last one left.
TAKE = text(
    """
    INSERT INTO inbox_rate_limits AS b (source, tokens, refilled_at)
    VALUES (:source, :burst, clock_timestamp())
        ON CONFLICT (source) DO UPDATE
       SET tokens = least(:burst, b.tokens + :rate
                          * extract(epoch FROM clock_timestamp() - b.refilled_at)),
           refilled_at = clock_timestamp()
    RETURNING tokens
    """
)
SPEND = text("UPDATE inbox_rate_limits SET tokens = tokens - :spent WHERE source = :source")
GIVE_BACK = text(
    "UPDATE inbox_rate_limits SET tokens = least(:burst, tokens + :count) WHERE source = :source"
)
TOKENS = text("SELECT source, tokens, refilled_at FROM inbox_rate_limits")


@dataclass(frozen=True)
class Taken:
    """Tokens taken (messages that may be claimed) and, when none, seconds until one is due."""

    granted: int
    wait_seconds: float


async def take(engine: AsyncEngine, source: str, rate: float, burst: float, want: int) -> Taken:
    async with translate_errors(), engine.begin() as conn:
        tokens = float(
            (
                await conn.execute(TAKE, {"source": source, "burst": burst, "rate": rate})
            ).scalar_one()
        )
        granted = max(0, min(want, int(tokens)))
        if granted:
            await conn.execute(SPEND, {"source": source, "spent": granted})
    return Taken(granted, 0.0 if granted else (1.0 - tokens) / rate)


async def give_back(engine: AsyncEngine, source: str, burst: float, count: int) -> None:
    """Return `count` tokens a claim took and did not use (fewer messages were due)."""
    if count <= 0:
        return
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(GIVE_BACK, {"source": source, "burst": burst, "count": count})


async def buckets(engine: AsyncEngine) -> dict[str, float]:
    """Each rate-limited source's tokens as last written."""
    async with translate_errors(), engine.connect() as conn:
        return {r.source: float(r.tokens) for r in await conn.execute(TOKENS)}
