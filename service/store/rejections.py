"""Refused deliveries (0017): kept in memory as ingest refuses them, written in batches by a
task of their own, bounded per source, and listed for the operator.

Ingest only appends to a per-source ring of at most `per_source` entries (a dict lookup and a
deque append, no await): a flood of bad requests cannot make a good delivery wait on the
database, nor grow memory, because the table keeps only a source's newest `per_source` rows
anyway, so an entry pushed out of a full ring is one the table would have dropped (counted
all the same). The writer inserts what gathered in one statement every `FLUSH_SECONDS` and,
in the same transaction, deletes each written source's rows past its newest `per_source`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.errors import translate_errors

log = logging.getLogger("service.rejections")

# A refused delivery is shown for at most this long: a sender misconfigured today.
MAX_AGE = timedelta(days=1)
# Gathering time of a batch: under a flood, one INSERT a source's `per_source` rows at most
# this often, instead of one a request.
FLUSH_SECONDS = 0.5
# Rows older than MAX_AGE are deleted this often even when nothing is refused.
EXPIRE_EVERY_SECONDS = 60.0
# Longest the last write may take when the app stops (the database may be gone).
CLOSE_SECONDS = 10.0

INSERT = text(
    """
    INSERT INTO inbox_rejected_deliveries
           (source, received_at, status, reason, detail, size, headers, request_id)
    SELECT r.source, r.received_at, r.status, r.reason, r.detail, r.size,
           CAST(r.headers AS jsonb), r.request_id
      FROM unnest(CAST(:sources AS text[]), CAST(:times AS timestamptz[]),
                  CAST(:statuses AS smallint[]), CAST(:reasons AS text[]),
                  CAST(:details AS text[]), CAST(:sizes AS bigint[]),
                  CAST(:headers AS text[]), CAST(:request_ids AS text[]))
           AS r(source, received_at, status, reason, detail, size, headers, request_id)
    """
)
# Each source's rows older than its newest :keep: the (source, id DESC) index finds the first
# of them by an offset scan of :keep entries, and the delete takes every id at or below it.
TRIM = text(
    """
    DELETE FROM inbox_rejected_deliveries AS r
     USING (SELECT s.source,
                   (SELECT k.id FROM inbox_rejected_deliveries AS k
                     WHERE k.source = s.source
                     ORDER BY k.id DESC OFFSET :keep LIMIT 1) AS newest_dropped
              FROM unnest(CAST(:sources AS text[])) AS s(source)) AS c
     WHERE r.source = c.source AND r.id <= c.newest_dropped
    """
)
# The table holds at most `per_source` rows a configured source: a scan of it is short.
EXPIRE = text(
    "DELETE FROM inbox_rejected_deliveries WHERE received_at < now() - CAST(:max_age AS interval)"
)
LIST = text(
    """
    SELECT id, source, received_at, status, reason, detail, size, headers, request_id
      FROM inbox_rejected_deliveries
     WHERE (CAST(:source AS text) IS NULL OR source = :source)
       AND (CAST(:before AS bigint) IS NULL OR id < :before)
       AND received_at >= now() - CAST(:max_age AS interval)
     ORDER BY id DESC
     LIMIT :limit
    """
)


@dataclass(frozen=True, slots=True)
class Rejection:
    """One refused delivery, as ingest saw it: headers already redacted, no body."""

    source: str
    received_at: datetime
    status: int
    reason: str
    detail: str
    size: int
    headers: dict[str, str]
    request_id: str | None


async def write_rejections(
    engine: AsyncEngine, rejections: Sequence[Rejection], per_source: int
) -> None:
    """Insert `rejections`, then trim each of their sources to its newest `per_source` rows."""
    if not rejections:
        return
    sources = sorted({r.source for r in rejections})
    async with translate_errors(), engine.begin() as conn:
        await conn.execute(
            INSERT,
            {
                "sources": [r.source for r in rejections],
                "times": [r.received_at for r in rejections],
                "statuses": [r.status for r in rejections],
                "reasons": [r.reason for r in rejections],
                "details": [r.detail for r in rejections],
                "sizes": [r.size for r in rejections],
                "headers": [orjson.dumps(r.headers).decode() for r in rejections],
                "request_ids": [r.request_id for r in rejections],
            },
        )
        await conn.execute(TRIM, {"sources": sources, "keep": per_source})


async def expire_rejections(engine: AsyncEngine) -> int:
    """Delete the rows older than `MAX_AGE`; how many went."""
    async with translate_errors(), engine.begin() as conn:
        return (await conn.execute(EXPIRE, {"max_age": MAX_AGE})).rowcount


async def list_rejections(
    engine: AsyncEngine, source: str | None, limit: int, before: int | None = None
) -> list[dict[str, Any]]:
    """Refused deliveries of the last day, newest first; `before`: only ids below it."""
    params = {"source": source, "before": before, "limit": limit, "max_age": MAX_AGE}
    async with translate_errors(), engine.connect() as conn:
        return [dict(row._mapping) for row in await conn.execute(LIST, params)]


class RejectionLog:
    """Refused deliveries on their way to the table; see the module's docstring.

    `on_dropped(source, count)` is told, at each write, of the entries pushed out of a full
    ring since the last one and of those lost with a write that failed: counted here and
    reported once a batch, since under `serve` each count is a locked write to a shared file."""

    def __init__(
        self,
        engine: AsyncEngine,
        per_source: int,
        on_dropped: Callable[[str, int], None] = lambda source, count: None,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self.engine = engine
        self.per_source = per_source
        self.on_dropped = on_dropped
        self.flush_seconds = flush_seconds
        self._pending: dict[str, deque[Rejection]] = {}
        self._dropped: dict[str, int] = {}
        self._wakeup = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, rejection: Rejection) -> None:
        ring = self._pending.get(rejection.source)
        if ring is None:
            ring = self._pending[rejection.source] = deque(maxlen=self.per_source)
        elif len(ring) == self.per_source:
            self._dropped[rejection.source] = self._dropped.get(rejection.source, 0) + 1
        ring.append(rejection)
        self._wakeup.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rejection-log")

    async def close(self) -> None:
        """Stop the writer once it has written what is pending (within `CLOSE_SECONDS`).

        Asked to stop rather than cancelled: Python 3.11's `wait_for` loses a cancellation
        that arrives as the event it waits on is set, and the writer would then run on."""
        self._closing.set()
        self._wakeup.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, CLOSE_SECONDS)
            self._task = None

    async def flush(self) -> None:
        """Write what has gathered now."""
        pending, self._pending = self._pending, {}
        dropped, self._dropped = self._dropped, {}
        batch = [r for ring in pending.values() for r in ring]
        try:
            await write_rejections(self.engine, batch, self.per_source)
        except Exception:
            log.warning("rejected deliveries not recorded", exc_info=True)
            for source, ring in pending.items():
                dropped[source] = dropped.get(source, 0) + len(ring)
            raise
        finally:
            for source, count in dropped.items():
                self.on_dropped(source, count)

    async def _run(self) -> None:
        expired_at = time.monotonic()
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), EXPIRE_EVERY_SECONDS)
            with contextlib.suppress(TimeoutError):  # let a batch gather, unless closing
                await asyncio.wait_for(self._closing.wait(), self.flush_seconds)
            self._wakeup.clear()
            if self._pending:
                with contextlib.suppress(Exception):  # logged and counted by flush
                    await self.flush()
            if time.monotonic() - expired_at >= EXPIRE_EVERY_SECONDS:
                expired_at = time.monotonic()
                try:
                    await expire_rejections(self.engine)
                except Exception:
                    log.warning("expiring rejected deliveries failed", exc_info=True)
