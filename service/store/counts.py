"""Messages by source and status, for `/metrics`, `/admin/stats` and the console's overview.

The unfinished rows (the backlog: pending, retrying, processing) are counted on every call:
the partial status index holds them, so that costs what they number, however large the
table. The ended ones (processed, dead, discarded) are most of the table, and counting them
reads every one of them: about 0.3 s per million rows on a 2-core machine; the dead ones
alone, 1 % of an inbox of 3 M, took 6 s to read cold. `EndedCounts` counts them again only
once the last count is old enough, so that Prometheus scrapes and an open console, each asking
every few seconds, do not keep PostgreSQL scanning the whole table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.schema import ENDED, UNFINISHED, sql_list
from service.store.claims import SHOWN_STATUS
from service.store.errors import translate_errors

log = logging.getLogger(__name__)

# Read through the partial status index (`inbox_messages_status_received_idx`, whose predicate
# the statuses imply). Messages claimed by a batch of Python handlers count as `processing`
# (SHOWN_STATUS).
UNFINISHED_COUNTS = text(
    f"""
    SELECT source, {SHOWN_STATUS} AS status, count(*) AS n,
           extract(epoch FROM now() - min(received_at)) AS oldest_age
      FROM inbox_messages
     WHERE status IN ({sql_list(UNFINISHED)})
     GROUP BY 1, 2
    """  # noqa: S608 - our own SQL, no input
)

ENDED_COUNTS = text(
    f"""
    SELECT source, status, count(*) AS n
      FROM inbox_messages
     WHERE status IN ({sql_list(ENDED)})
     GROUP BY source, status
    """  # noqa: S608 - our own status values, no input
)

# A count of the ended rows that took less than this is not kept: on a table that small,
# every call counts them again, exactly.
SLOW_COUNT_SECONDS = 0.1
# A slower count is kept for this many times as long as it took.
REUSE_FACTOR = 10.0

# Ended rows by (source, status).
Counted = dict[tuple[str, str], int]


@dataclass(frozen=True)
class StatusCount:
    source: str
    status: str
    count: int
    oldest_age_seconds: float  # 0 for ended rows, whose age nothing reads


async def count_ended(engine: AsyncEngine) -> Counted:
    """Ended rows (processed, dead, discarded) by source and status, counted now."""
    async with translate_errors(), engine.connect() as conn:
        return {(r.source, r.status): int(r.n) for r in await conn.execute(ENDED_COUNTS)}


class EndedCounts:
    """Ended rows by source and status, reused while counting them again would be too costly.

    A count that took `slow_seconds` or longer is kept for `reuse_factor` times as long as it
    took: at most about a tenth of the time goes to counting, however often it is asked. Past
    that, a call gets the kept count at once while a new count runs in the background, so no
    request waits on it; only the first call of a process waits. One count runs at a time,
    whoever asks.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        slow_seconds: float = SLOW_COUNT_SECONDS,
        reuse_factor: float = REUSE_FACTOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.slow_seconds = slow_seconds
        self.reuse_factor = reuse_factor
        self.clock = clock
        self._kept: Counted | None = None
        self._fresh_until = 0.0
        self._counting: asyncio.Task[Counted] | None = None

    async def get(self) -> Counted:
        if self._kept is not None:
            if self.clock() >= self._fresh_until and self._counting is None:
                self._start_counting().add_done_callback(_log_failure)
            return self._kept
        # shield: a request that is cancelled while it waits does not cancel the count the
        # others wait on too. Its failure reaches whoever waits; the callback only marks it
        # retrieved, for when all of them were cancelled.
        counting = self._counting
        if counting is None:
            counting = self._start_counting()
            counting.add_done_callback(_retrieved)
        return await asyncio.shield(counting)

    def _start_counting(self) -> asyncio.Task[Counted]:
        self._counting = asyncio.get_running_loop().create_task(self._count())
        return self._counting

    async def _count(self) -> Counted:
        started = self.clock()
        try:
            counts = await count_ended(self.engine)
        finally:
            self._counting = None
        took = self.clock() - started
        if took >= self.slow_seconds:
            self._kept = counts
            self._fresh_until = self.clock() + took * self.reuse_factor
        else:
            self._kept = None
        return counts

    async def close(self) -> None:
        """Stop a count in progress (before the engine is disposed)."""
        if self._counting is not None:
            self._counting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._counting


def _retrieved(task: asyncio.Task[Counted]) -> None:
    if not task.cancelled():
        task.exception()


def _log_failure(task: asyncio.Task[Counted]) -> None:
    error = None if task.cancelled() else task.exception()
    if error is not None:
        log.warning(
            "counting the ended messages failed; the last count stays in use",
            extra={"error": f"{type(error).__name__}: {error}"},
        )


async def status_counts(engine: AsyncEngine, ended: EndedCounts | None = None) -> list[StatusCount]:
    """Rows per (source, status), with the age of each unfinished group's oldest row. The
    ended rows come from `ended` when given (a long-lived process), else are counted now (a
    command run once)."""
    async with translate_errors(), engine.connect() as conn:
        rows = await conn.execute(UNFINISHED_COUNTS)
        counts = [
            StatusCount(r.source, r.status, int(r.n), max(float(r.oldest_age), 0.0)) for r in rows
        ]
    done = await ended.get() if ended is not None else await count_ended(engine)
    counts += [StatusCount(source, status, n, 0.0) for (source, status), n in done.items()]
    return counts
