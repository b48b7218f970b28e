"""The live tail (`webhook-inbox tail`, GET /admin/tail): each delivery accepted, each duplicate
and each attempt's outcome since a position, read from the tables every process writes.

Accepted messages and attempts are followed by id. An id is taken before its transaction
commits, so a smaller one can commit after a larger one was read (two ingest flushers, two
workers): the ids skipped over are looked at again for `SETTLE_SECONDS` (rolled-back inserts
leave ids that never come). A duplicate leaves no row of its own; ingest counts it on its
message's row, and the tail finds those rows by `last_received_at` (0019's partial index),
reading a little behind the newest it saw and remembering what it showed there. A
redelivery kept aside in `inbox_receipts` (its row was locked by a running batch) is read by
id before the worker adds it to the row.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.status import TAIL_OUTCOMES, TailKind
from service.store.admin import event_type_clause
from service.store.errors import translate_errors
from service.store.notifications import listen_for_messages

SETTLE_SECONDS = 10.0  # how long a skipped id may still commit: the group commit's wait
MAX_GAPS = 5_000  # skipped ids watched at once, the newest kept
REDELIVERY_OVERLAP = timedelta(seconds=2)  # how far behind the newest duplicate seen to read
TAIL_LISTENER_NAME = "webhook-inbox-tail"  # apart from the workers' listeners

START = text(
    """
    SELECT (SELECT coalesce(max(id), 0) FROM inbox_messages) AS messages,
           (SELECT coalesce(max(id), 0) FROM inbox_attempts) AS attempts,
           (SELECT coalesce(max(id), 0) FROM inbox_receipts) AS receipts,
           now() AS now
    """
)

# Each read takes the ids after the cursor and the skipped ones, matching the filters or not
# (`shown` says which), so that the cursor passes over rows the filters leave out.
ACCEPTED = """
    SELECT id, received_at AS at, source, message_id, event_type, receive_count, {shown} AS shown
      FROM inbox_messages
     WHERE id > :after OR id = ANY(CAST(:gaps AS bigint[]))
     ORDER BY id
     LIMIT :limit
"""

# An attempt whose message was pruned since is not shown (`m` is null, `shown` not true).
OUTCOMES = """
    SELECT a.id, a.finished_at AS at, a.outcome, a.attempt, a.error_type, a.error,
           a.destination, m.id AS message, m.source, m.message_id, m.event_type,
           coalesce(a.outcome = ANY(CAST(:outcomes AS text[])) AND {shown}, false) AS shown
      FROM inbox_attempts AS a
      LEFT JOIN inbox_messages AS m ON m.id = a.message_id
     WHERE a.id > :after OR a.id = ANY(CAST(:gaps AS bigint[]))
     ORDER BY a.id
     LIMIT :limit
"""

# Through the partial index of redelivered rows (0019): a first delivery is not in it.
REDELIVERED = """
    SELECT id, last_received_at AS at, source, message_id, event_type, receive_count
      FROM inbox_messages
     WHERE receive_count > 1 AND last_received_at > :since AND {shown}
     ORDER BY last_received_at
     LIMIT :limit
"""

KEPT_ASIDE = """
    SELECT r.id, r.received_at AS at, m.id AS message, r.source, r.message_id, m.event_type,
           coalesce({shown}, false) AS shown
      FROM inbox_receipts AS r
      LEFT JOIN inbox_messages AS m ON m.source = r.source AND m.message_id = r.message_id
     WHERE r.id > :after OR r.id = ANY(CAST(:gaps AS bigint[]))
     ORDER BY r.id
     LIMIT :limit
"""


@dataclass(frozen=True)
class TailFilter:
    """Which events the tail shows; every filter that is set must hold."""

    sources: Sequence[str] = ()  # none: every source
    kinds: Sequence[TailKind] = ()  # none: every kind
    event_type: str | None = None  # `*` and `?` wildcards, as the admin listings

    def shows(self, kind: TailKind) -> bool:
        return not self.kinds or kind in self.kinds

    def condition(self, alias: str = "") -> tuple[str, dict[str, Any]]:
        """The message filters as one SQL condition over the row named `alias`."""
        prefix = f"{alias}." if alias else ""
        clauses = ["true"]
        params: dict[str, Any] = {}
        if self.sources:
            clauses.append(f"{prefix}source = ANY(CAST(:sources AS text[]))")
            params["sources"] = list(self.sources)
        if self.event_type is not None:
            clause, bound = event_type_clause(self.event_type, f"{prefix}event_type")
            clauses.append(clause)
            params |= bound
        return "(" + " AND ".join(clauses) + ")", params


@dataclass(frozen=True)
class TailEvent:
    """One thing that happened to a message, as the tail shows it."""

    at: datetime
    kind: TailKind
    id: int  # the inbox row id
    source: str
    message_id: str
    event_type: str | None
    attempt: int | None = None  # an outcome's attempt number
    destination: str | None = None  # an outcome's named destination
    error_type: str | None = None  # a failure's
    error: str | None = None
    deliveries: int | None = None  # a duplicate's: deliveries counted so far (None: not yet)


@dataclass
class IdCursor:
    """The last id read from a table, and the smaller ids skipped that may still commit."""

    after: int
    gaps: dict[int, float] = field(default_factory=dict)  # id: monotonic time it is given up

    def params(self) -> dict[str, Any]:
        return {"after": self.after, "gaps": list(self.gaps)}

    def advance(self, ids: Sequence[int], now: float) -> None:
        for expired in [i for i, until in self.gaps.items() if until <= now]:
            del self.gaps[expired]
        for found in ids:
            self.gaps.pop(found, None)
        top = max(ids, default=self.after)
        if top > self.after:
            seen = set(ids)
            for skipped in range(max(self.after + 1, top - MAX_GAPS), top):
                if skipped not in seen:
                    self.gaps[skipped] = now + SETTLE_SECONDS
            self.after = top
        while len(self.gaps) > MAX_GAPS:
            del self.gaps[min(self.gaps)]


@dataclass
class Tail:
    """A position in the inbox's history, read forward in bounded steps (`read`)."""

    engine: AsyncEngine
    filters: TailFilter = field(default_factory=TailFilter)
    limit: int = 500  # rows a table, a read
    messages: IdCursor = field(default_factory=lambda: IdCursor(0))
    attempts: IdCursor = field(default_factory=lambda: IdCursor(0))
    receipts: IdCursor = field(default_factory=lambda: IdCursor(0))
    redelivered_since: datetime | None = None
    # Duplicates shown within the overlap: row id -> (receive_count shown, last_received_at).
    shown_redeliveries: dict[int, tuple[int, datetime]] = field(default_factory=dict)
    # The newest receipt shown of each row (row id -> its time): once the worker adds it to
    # the row, `last_received_at` is that time, and it is not shown again.
    shown_receipts: dict[int, datetime] = field(default_factory=dict)

    async def start(self) -> None:
        """Begin at the newest row of each table: what happens from now on."""
        async with translate_errors(), self.engine.connect() as conn:
            row = (await conn.execute(START)).one()
        self.messages = IdCursor(int(row.messages))
        self.attempts = IdCursor(int(row.attempts))
        self.receipts = IdCursor(int(row.receipts))
        self.redelivered_since = row.now

    async def read(self) -> tuple[list[TailEvent], bool]:
        """The events since the last read, oldest first, and whether more are waiting (a
        table gave `limit` rows)."""
        now = time.monotonic()
        async with translate_errors(), self.engine.connect() as conn:
            events, full = [], False
            for step in (self._accepted, self._outcomes, self._redelivered, self._kept_aside):
                found, more = await step(conn, now)
                events += found
                full = full or more
        events.sort(key=lambda e: e.at)
        return events, full

    async def _rows(
        self, conn: AsyncConnection, sql: str, alias: str, params: dict[str, Any]
    ) -> list[Any]:
        shown, filter_params = self.filters.condition(alias)
        statement = text(sql.format(shown=shown))
        result = await conn.execute(statement, {**params, **filter_params, "limit": self.limit})
        return list(result.all())

    async def _followed(
        self,
        conn: AsyncConnection,
        sql: str,
        alias: str,
        cursor: IdCursor,
        now: float,
        **params: Any,
    ) -> list[Any]:
        """The rows after `cursor` (and those it skipped), which then moves past them."""
        rows = await self._rows(conn, sql, alias, {**cursor.params(), **params})
        cursor.advance([r.id for r in rows], now)
        return rows

    async def _accepted(self, conn: AsyncConnection, now: float) -> tuple[list[TailEvent], bool]:
        rows = await self._followed(conn, ACCEPTED, "", self.messages, now)
        events = [
            TailEvent(r.at, TailKind.ACCEPTED, r.id, r.source, r.message_id, r.event_type)
            for r in rows
            if r.shown and self.filters.shows(TailKind.ACCEPTED)
        ]
        return events, len(rows) == self.limit

    async def _outcomes(self, conn: AsyncConnection, now: float) -> tuple[list[TailEvent], bool]:
        outcomes = [o for o, kind in TAIL_OUTCOMES.items() if self.filters.shows(kind)]
        rows = await self._followed(conn, OUTCOMES, "m", self.attempts, now, outcomes=outcomes)
        events = [
            TailEvent(
                r.at,
                TAIL_OUTCOMES[r.outcome],
                r.message,
                r.source,
                r.message_id,
                r.event_type,
                attempt=r.attempt,
                destination=r.destination,
                error_type=r.error_type,
                error=r.error,
            )
            for r in rows
            if r.shown
        ]
        return events, len(rows) == self.limit

    async def _redelivered(self, conn: AsyncConnection, now: float) -> tuple[list[TailEvent], bool]:
        if not self.filters.shows(TailKind.DUPLICATE) or self.redelivered_since is None:
            return [], False
        since = self.redelivered_since
        rows = await self._rows(conn, REDELIVERED, "", {"since": since - REDELIVERY_OVERLAP})
        events = []
        for r in rows:
            already = self.shown_redeliveries.get(r.id, (0,))[0] >= r.receive_count
            counted = self.shown_receipts.get(r.id) == r.at  # a receipt shown, now counted
            self.shown_redeliveries[r.id] = (r.receive_count, r.at)
            if (r.at <= since and already) or counted:
                continue  # read again within the overlap, or shown as a receipt
            events.append(
                TailEvent(
                    r.at,
                    TailKind.DUPLICATE,
                    r.id,
                    r.source,
                    r.message_id,
                    r.event_type,
                    deliveries=r.receive_count,
                )
            )
        self.redelivered_since = max([since, *(r.at for r in rows)])
        floor = self.redelivered_since - REDELIVERY_OVERLAP
        for old in [i for i, (_, at) in self.shown_redeliveries.items() if at < floor]:
            del self.shown_redeliveries[old]
        for old in [i for i, at in self.shown_receipts.items() if at < floor]:
            del self.shown_receipts[old]
        return events, len(rows) == self.limit

    async def _kept_aside(self, conn: AsyncConnection, now: float) -> tuple[list[TailEvent], bool]:
        rows = await self._followed(conn, KEPT_ASIDE, "m", self.receipts, now)
        for r in rows:
            if r.message is not None:
                self.shown_receipts[r.message] = max(r.at, self.shown_receipts.get(r.message, r.at))
        events = [
            TailEvent(r.at, TailKind.DUPLICATE, r.message, r.source, r.message_id, r.event_type)
            for r in rows
            if r.shown and self.filters.shows(TailKind.DUPLICATE)
        ]
        return events, len(rows) == self.limit


async def follow(
    engine: AsyncEngine, filters: TailFilter, poll_seconds: float = 0.5
) -> AsyncIterator[list[TailEvent]]:
    """The events from now on, a list each time the tail reads (empty when nothing happened),
    until the caller stops iterating. A read follows each NOTIFY of ingest's (new messages to
    run), each `poll_seconds` otherwise (outcomes and duplicates notify nobody), and at once
    after a read that left rows waiting."""
    tail = Tail(engine, filters)
    await tail.start()
    woken = asyncio.Event()
    url = engine.url.render_as_string(hide_password=False)
    listener = asyncio.create_task(listen_for_messages(url, woken.set, TAIL_LISTENER_NAME))
    try:
        while True:
            woken.clear()
            events, more = await tail.read()
            yield events
            if not more:
                # asyncio.timeout, not wait_for: on Python 3.11, wait_for can swallow the
                # cancellation that Ctrl-C sends when its wait ends at the same moment, and the
                # tail then never stops (seen twice in a full test run on a loaded machine).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_seconds):
                        await woken.wait()
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
