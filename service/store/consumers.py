"""The broker consumers' state (`inbox_consumers`, 0021): each consumer process's row, by
source, written by the process itself and read by whichever HTTP process answers.

A consumer writes its row every `REPORT_SECONDS` and on each change of state, and deletes it
on a clean stop; a row older than `FRESH_SECONDS` is one whose process died without that stop
(SIGKILL, a lost host), or cannot reach the database. Freshness is judged on the database's
clock, the one every process shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.errors import translate_errors
from service.store.savepoints import short_transaction

# A consumer writes its row this often at least, and readers count it as alive for three
# such periods: one missed write (a slow database, a GC pause) does not make it stale.
REPORT_SECONDS = 5.0
FRESH_SECONDS = 15.0

# Insert on the first report, then update; `started_at` stays the first report's.
REPORT = text(
    """
    INSERT INTO inbox_consumers AS c
           (source, consumer, connected, state, last_error, lag, counts)
    VALUES (:source, :consumer, :connected, :state, :last_error, :lag, CAST(:counts AS jsonb))
        ON CONFLICT (source, consumer) DO UPDATE
       SET connected = excluded.connected, state = excluded.state,
           last_error = excluded.last_error, lag = excluded.lag, counts = excluded.counts,
           updated_at = now()
    """
)
FORGET = text("DELETE FROM inbox_consumers WHERE source = :source AND consumer = :consumer")
LIST = text(
    """
    SELECT source, consumer, connected, state, last_error, lag, counts, started_at, updated_at,
           updated_at < now() - make_interval(secs => :fresh) AS stale
      FROM inbox_consumers
     ORDER BY source, consumer
    """
)
# Per source, its consumers alive and connected, and the broker's lag as the freshest of
# them last read it.
CONNECTED = text(
    """
    SELECT source, count(*) FILTER (WHERE connected) AS connected,
           (array_agg(lag ORDER BY updated_at DESC) FILTER (WHERE lag IS NOT NULL))[1] AS lag
      FROM inbox_consumers
     WHERE updated_at >= now() - make_interval(secs => :fresh)
     GROUP BY source
    """
)


@dataclass(frozen=True)
class ConsumerReport:
    """What a consumer process says of itself for one source."""

    source: str
    consumer: str
    connected: bool
    state: str
    last_error: str | None
    lag: int | None
    counts: Mapping[str, int]


@dataclass(frozen=True)
class ConsumerRow:
    """A consumer's row as read, `stale` when not written for `FRESH_SECONDS`."""

    source: str
    consumer: str
    connected: bool
    state: str
    last_error: str | None
    lag: int | None
    counts: dict[str, int]
    started_at: datetime
    updated_at: datetime
    stale: bool


@dataclass(frozen=True)
class SourceConsumers:
    """A broker source's fresh consumers: how many are connected, and the broker's lag."""

    connected: int
    lag: int | None


async def report_consumers(engine: AsyncEngine, reports: Sequence[ConsumerReport]) -> None:
    """Write each consumer's row, in one transaction."""
    if not reports:
        return
    async with short_transaction(engine) as conn:
        await conn.execute(
            REPORT,
            [
                {
                    "source": r.source,
                    "consumer": r.consumer,
                    "connected": r.connected,
                    "state": r.state,
                    "last_error": r.last_error,
                    "lag": r.lag,
                    "counts": orjson.dumps(dict(r.counts)).decode(),
                }
                for r in reports
            ],
        )


async def forget_consumers(engine: AsyncEngine, source_names: Sequence[str], consumer: str) -> None:
    """Delete the process's rows: it stopped cleanly."""
    async with short_transaction(engine) as conn:
        await conn.execute(FORGET, [{"source": s, "consumer": consumer} for s in source_names])


async def list_consumers(engine: AsyncEngine) -> list[ConsumerRow]:
    """Every consumer's row, stale ones included, by source and process."""
    async with translate_errors(), engine.connect() as conn:
        rows = await conn.execute(LIST, {"fresh": FRESH_SECONDS})
        return [ConsumerRow(**row._mapping) for row in rows]


async def consumers_by_source(engine: AsyncEngine) -> dict[str, SourceConsumers]:
    """Per source with a fresh row: its connected consumers and the lag last read."""
    async with translate_errors(), engine.connect() as conn:
        rows = await conn.execute(CONNECTED, {"fresh": FRESH_SECONDS})
        return {
            r.source: SourceConsumers(int(r.connected), None if r.lag is None else int(r.lag))
            for r in rows
        }
