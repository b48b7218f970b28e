"""Circuit breakers of the sources' forwards (0014), shared by every process on the database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.errors import translate_errors

ENSURE = text("INSERT INTO inbox_breakers (source) VALUES (:source) ON CONFLICT DO NOTHING")
LOCK = text(
    "SELECT failures, open_until, probing_until, reserved, reserved_until, "
    "clock_timestamp() AS now FROM inbox_breakers WHERE source = :source FOR UPDATE"
)
RESERVE = text(
    "UPDATE inbox_breakers SET reserved = :reserved, "
    "reserved_until = clock_timestamp() + :lease * interval '1 second' WHERE source = :source"
)
TAKE_PROBE = text(
    "UPDATE inbox_breakers SET probing_until = clock_timestamp() + :lease * interval '1 second' "
    "WHERE source = :source"
)

# After a claim's forwards, under the row's lock (LOCK): a success closes the breaker;
# failures with none count on, and open it at the limit.
SET_STATE = text(
    """
    UPDATE inbox_breakers
       SET failures = :failures,
           open_until = CASE WHEN :open
                             THEN clock_timestamp() + :cooldown * interval '1 second' END,
           opened_at = CASE WHEN NOT :open THEN NULL
                            WHEN :opened THEN clock_timestamp() ELSE opened_at END,
           probing_until = NULL,
           reserved = greatest(0, reserved - :released),
           last_error = coalesce(:error, last_error)
     WHERE source = :source
    """
)
STATES = text(
    "SELECT source, failures, open_until, probing_until, opened_at, last_error, "
    "open_until IS NOT NULL AS open FROM inbox_breakers"
)


@dataclass(frozen=True)
class Admission:
    state: str  # "closed", "probe" or "open"
    allowed: int  # messages that may be claimed now
    wait_seconds: float  # open: until the cool-down ends


async def admit(engine: AsyncEngine, source: str, limit: int, lease: float, want: int) -> Admission:
    """What a worker may claim of `source` now: `closed` (up to the failures left before the
    breaker opens), `probe` (the cool-down is over and this worker took the probe: one
    message, leased for `lease` seconds) or `open` (nothing, and the seconds to wait). Under
    the row's lock, so one process takes a probe."""
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(ENSURE, {"source": source})
        row = (await conn.execute(LOCK, {"source": source})).one()
        if row.open_until is None:
            live = row.reserved_until is not None and row.reserved_until > row.now
            reserved = int(row.reserved) if live else 0
            allowed = min(want, limit - int(row.failures) - reserved)
            if allowed <= 0:  # other claims in flight hold what is left: wait for them
                return Admission("open", 0, 0.2)
            await conn.execute(
                RESERVE, {"source": source, "reserved": reserved + allowed, "lease": lease}
            )
            return Admission("closed", allowed, 0.0)
        if row.open_until > row.now:
            return Admission("open", 0, (row.open_until - row.now).total_seconds())
        if row.probing_until is None or row.probing_until < row.now:
            await conn.execute(TAKE_PROBE, {"source": source, "lease": lease})
            return Admission("probe", 1, 0.0)
        return Admission("open", 0, min(1.0, (row.probing_until - row.now).total_seconds()))


async def record(
    engine: AsyncEngine,
    source: str,
    *,
    failed: int,
    succeeded: int,
    limit: int,
    cooldown: float,
    error: str | None,
    released: int = 0,
) -> tuple[bool, bool]:
    """Count a claim's outcomes (a probe's, or a closed breaker's claim); (open now, just
    opened). A claim with neither outcome (an unused probe) leaves it open, probe released."""
    async with translate_errors(), engine.begin() as conn:
        row = (await conn.execute(LOCK, {"source": source})).one()
        was_open = row.open_until is not None
        if succeeded:
            failures, is_open = 0, False
        else:
            failures = row.failures + failed
            is_open = was_open or failures >= limit
        await conn.execute(
            SET_STATE,
            {
                "source": source,
                "failures": failures,
                "open": is_open,
                "opened": is_open and not was_open,
                "cooldown": cooldown,
                "error": error,
                "released": released,
            },
        )
    return is_open, is_open and not was_open


async def states(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    async with translate_errors(), engine.connect() as conn:
        return {r.source: dict(r._mapping) for r in await conn.execute(STATES)}
