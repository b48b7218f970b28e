"""Group commit: concurrent deliveries share one INSERT and one COMMIT, each still awaited."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import command_timeout
from service.core.metrics import Metrics
from service.core.settings import Settings
from service.sources.base import Message, Recorded
from service.store.errors import (
    StoreOverloaded,
    StoreUnavailable,
    is_refusal,
    is_unavailable,
    refused,
    translate_errors,
)
from service.store.notifications import NOTIFY_CHANNEL

log = logging.getLogger(__name__)

# One statement, autocommitted, is the whole batch: one round trip instead of BEGIN, INSERT,
# UPDATE, NOTIFY and COMMIT (two when a plain insert meets a stored key: INSERT_BATCH below).
# Rows arrive deduplicated (each key once, with `received`, the number of times the batch
# holds it) and in `lock_order`, so that two batches that share keys lock them in the same
# order instead of deadlocking; the ids follow that order.
# - The rows come as one JSON document ($1: an array of [source, message_id, event_type, headers,
#   content_type, done, received, trace_context, ordering_key, searchable]) and their bodies as
#   a bytea array ($2), in the same order. The driver encodes an array parameter element by
#   element, with checks on each: nine arrays cost the HTTP process more CPU than one document
#   orjson writes in a C call (docs/benchmarks.md, "What holds ingest at 32 connections"). Row n
#   is element n - 1 of the document, read by index, so the rows keep the bodies' order.
# - `xmax = 0` in RETURNING tells the rows this statement inserted from those it updated
#   (an updated row carries our own transaction id as its xmax).
# - A message of a source with nothing to run (no handlers, no forward) is stored `processed`
#   at once: no worker round, no status change, no index entry rewritten.
# - pg_notify ($3: the channel), once per batch that inserted a pending row, is sent when
#   the statement's implicit transaction commits. The scalar subquery makes the otherwise
#   unreferenced `woken` CTE run; a SELECT CTE nobody reads is never evaluated.
_ROWS = """unnest($2::bytea[]) WITH ORDINALITY AS b(body, n)
           CROSS JOIN LATERAL (SELECT $1::jsonb -> (n::int - 1)) AS t(r)"""
# Each row of a batch as a message row; {rows}: where the rows (r, body) come from.
_INSERT_ROWS = """
    INSERT INTO inbox_messages AS m (source, message_id, event_type, headers, body,
                                     content_type, status, processed_at, receive_count,
                                     trace_context, ordering_key, searchable)
    SELECT r->>0, r->>1, r->>2, r->3, body, r->>4,
           CASE WHEN (r->5)::boolean THEN 'processed' ELSE 'pending' END,
           CASE WHEN (r->5)::boolean THEN now() END,
           (r->6)::int, nullif(r->7, 'null'), r->>8, (r->9)::boolean
      FROM {rows}"""
_BATCH = f"""
WITH written AS ({_INSERT_ROWS.format(rows=_ROWS)}
    ON_CONFLICT
    RETURNING m.id, m.source, m.message_id, m.xmax = 0 AS inserted, m.status = 'pending'
              AS pending
), woken AS (
    SELECT pg_notify($3, '') FROM written WHERE inserted AND pending LIMIT 1
)
SELECT id, source, message_id, inserted, (SELECT count(*) FROM woken) AS notified
  FROM written
"""  # noqa: S608 - our own SQL, no input

# The batch with its redeliveries counted. ON CONFLICT DO UPDATE, not DO NOTHING plus a later
# UPDATE: it locks and counts the row that conflicts even when its inserting transaction
# committed after this statement's snapshot was taken, which a separate UPDATE in the same
# statement would not see.
RECORD_BATCH = _BATCH.replace(
    "ON_CONFLICT",
    """ON CONFLICT (source, message_id) DO UPDATE
       SET receive_count = m.receive_count + EXCLUDED.receive_count,
           last_received_at = now()""",
)

# The batch when none of its keys is expected to be stored yet, which is nearly every batch:
# ON CONFLICT first looks each row's key up in the unique index and only then inserts, which
# descends the index again; a plain insert descends it once and checks the key there. That
# is 10-19% of the backend's CPU a row (docs/benchmarks.md, "What holds ingest at 32
# connections"). A batch that meets a stored key fails whole and is rolled back (its rows
# left dead for vacuum); it is written again with RECORD_BATCH, which this committer then
# uses for every batch until CONFLICT_WINDOW_SECONDS pass without a redelivery, so a sender
# that keeps redelivering costs one failed statement, not one a batch. Any unique violation
# is retried so, whatever the dedup key's constraint is named: another one would fail
# RECORD_BATCH too, and be a refused row.
INSERT_BATCH = _BATCH.replace("ON_CONFLICT", "")
CONFLICT_WINDOW_SECONDS = 10.0

# How long a batch waits for a lock before it stops waiting (the ingest connections'
# `lock_timeout`). RECORD_BATCH waits for the row lock of each stored key it counts, and a
# batch of Python handlers holds its messages' rows locked for as long as its handlers run
# (up to `handler_timeout_seconds`): a redelivery of a message being handled would hold the
# whole batch, and every delivery queued behind it, that long. Other waits (a concurrent
# batch inserting the same key, an admin action on the row) last milliseconds. bench/soak
# (200/s, 30% redeliveries): with no bound, p99.9 1.1 s and the slowest delivery 1.5 s; with
# 100 ms, 107 ms and 208 ms, the waits themselves.
LOCK_WAIT = "50ms"

# The batch when a row it would count stayed locked past LOCK_WAIT: new keys are inserted as
# ever, and each stored key's redeliveries are kept in `inbox_receipts`, with no lock taken
# on the stored row, for the worker to add to it once it is free (`fold_receipts`). DO
# NOTHING waits only for a concurrent insert of the same key, never for a stored row's lock;
# run without LOCK_WAIT, inside a transaction of its own.
DEFER_BATCH = f"""
WITH batch AS MATERIALIZED (
    SELECT r, body FROM {_ROWS}
), written AS ({_INSERT_ROWS.format(rows="batch")}
    ON CONFLICT (source, message_id) DO NOTHING
    RETURNING m.id, m.source, m.message_id, true AS inserted, m.status = 'pending' AS pending
), deferred AS (
    INSERT INTO inbox_receipts (source, message_id, received)
    SELECT r->>0, r->>1, (r->6)::int
      FROM batch
     WHERE NOT EXISTS (SELECT 1 FROM written AS w
                        WHERE w.source = r->>0 AND w.message_id = r->>1)
), woken AS (
    SELECT pg_notify($3, '') FROM written WHERE pending LIMIT 1
)
SELECT id, source, message_id, inserted, (SELECT count(*) FROM woken) AS notified
  FROM written
"""  # noqa: S608 - our own SQL, no input

# A deadlock or serialization failure rolls back the whole batch; trying again is safe.
_RETRYABLE = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)


def lock_order(first: Mapping[tuple[str, str], tuple[_Entry, Message]]) -> list[tuple[str, str]]:
    """A batch's keys (`first`: in the order the senders gave them) in the order they are
    inserted: the order their unique-index entries are locked in, and their ids' order.

    By source, ordering key and message id, as every batch sorts them, so that two batches
    sharing keys wait for each other in one direction only; but one ordering key's messages
    in the senders' order, since their ids are the order they run in, and a batch delivery
    (Event Grid, CloudEvents) may list them in any id order. Two batches then lock one key's
    messages in opposite orders only if senders gave them so; PostgreSQL detects that
    deadlock and the batch it fails is written again (`_RETRYABLE`)."""
    position = {key: n for n, key in enumerate(first)}

    def place(key: tuple[str, str]) -> tuple[str, bool, str, int, str]:
        ordering_key = first[key][1].ordering_key
        keyed = ordering_key is not None
        return (key[0], keyed, ordering_key or "", position[key] if keyed else 0, key[1])

    return sorted(first, key=place)


@dataclass(eq=False)
class _Entry:
    """One request's messages, waiting to be written with whatever else is waiting."""

    source: str
    messages: Sequence[Message]
    headers: dict[str, str]
    body: bytes
    content_type: str | None
    processed: bool  # nothing to run: stored `processed`
    searchable: bool  # its payload indexed for search (`search_payload`)
    done: asyncio.Future[list[Recorded]]


def _give_up(done: asyncio.Future[list[Recorded]]) -> None:
    if not done.done():
        done.set_exception(StoreUnavailable("the database did not commit in time"))


class _Deadlines:
    """Gives up on each request that has waited `wait_timeout` for its commit, with one timer
    for all of them rather than one per request (a timer set and cancelled for every delivery
    cost more than the rest of `record`).

    Requests are watched in the order they arrived, so the first one watched is always the
    next to run out of time; the ones answered are dropped from the front as new ones come.
    """

    def __init__(self, wait_timeout: float, max_queued: int) -> None:
        self.wait_timeout = wait_timeout
        self.max_queued = max_queued
        self._compact_at = 2 * max_queued
        self._watched: deque[tuple[float, asyncio.Future[list[Recorded]]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, done: asyncio.Future[list[Recorded]]) -> None:
        watched = self._watched
        while watched and watched[0][1].done():
            watched.popleft()
        if len(watched) > self._compact_at:
            # Answered ones pile up behind a request still waiting. Keeping the unanswered
            # (about max_queued at most: `record` refuses beyond it) halves the list at least.
            self._watched = watched = deque(w for w in watched if not w[1].done())
            self._compact_at = 2 * max(self.max_queued, len(watched))
        loop = done.get_loop()
        watched.append((loop.time() + self.wait_timeout, done))
        if self._timer is None:
            self._timer = loop.call_at(watched[0][0], self._expire)

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        watched = self._watched
        while watched and (watched[0][1].done() or watched[0][0] <= now):
            _give_up(watched.popleft()[1])
        if watched:
            self._timer = loop.call_at(watched[0][0], self._expire)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class GroupCommitter:
    """Writes the deliveries of concurrent requests in shared transactions.

    A request's entry is written by the next free flusher together with every entry that
    arrived while the flushers were busy (at most `max_batch` messages), so an idle service
    writes a lone request at once and a busy one amortises each COMMIT over many requests.
    Each request's future resolves only after the COMMIT that holds its rows. When the
    database is unreachable the whole batch fails with `StoreUnavailable`; when it refuses a
    row (`StoreRefused`), only the request that brought the row fails and the rest of the
    batch is written without it.

    At most `max_queued` messages are held at once, counted from `record` until their entry
    has been written or dropped: a request that stops waiting (timeout, disconnect) leaves
    its entry counted until a flusher drops it unwritten, so a stalled database cannot make
    each new wave of requests queue another `max_queued` bodies.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        flushers: int = 1,
        max_batch: int = 500,
        max_queued: int = 5000,
        wait_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        on_rewrite: Callable[[], None] | None = None,
        on_kept_aside: Callable[[int], None] | None = None,
    ) -> None:
        self.engine = engine
        self.connect_timeout = connect_timeout
        self.max_batch = max_batch
        self.max_queued = max_queued
        self.flusher_count = flushers
        self._pending: deque[_Entry] = deque()
        self._held = 0  # messages of entries queued or being written
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._deadlines = _Deadlines(wait_timeout, max_queued)
        # The loop the requests' futures belong to, kept: `asyncio.get_running_loop()` costs
        # a getpid() system call in Python 3.11, and this is asked once a delivery.
        self._loop: asyncio.AbstractEventLoop | None = None
        # Until when (loop time) batches are written with RECORD_BATCH: a batch met a stored key
        # shortly before.
        self._conflicts_until = 0.0
        self.conflict_retries = 0  # batches written again: their plain insert met a stored key
        self.deferred_batches = 0  # batches written with DEFER_BATCH: a lock outlasted LOCK_WAIT
        self._on_rewrite = on_rewrite  # told of each of them (the metrics)
        self._on_kept_aside = on_kept_aside  # told how many redeliveries went to inbox_receipts

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name=f"group-commit-{i}")
            for i in range(self.flusher_count)
        ]

    async def _connect(self) -> asyncpg.Connection:
        """A connection of the flusher's own: no pool checkout and no pre-ping per batch.

        A connection that fails is closed and replaced at the next batch, which is what a
        pool's pre-ping would have done, without its round trips on every acknowledgement.
        """
        url = self.engine.url.set(drivername="postgresql")
        connection: asyncpg.Connection = await asyncpg.connect(
            url.render_as_string(hide_password=False),
            timeout=self.connect_timeout,
            # A hung server must not hold a flusher (and its batch's requests) forever.
            command_timeout=command_timeout(self.connect_timeout),
            server_settings={"application_name": "webhook-inbox ingest", "lock_timeout": LOCK_WAIT},
        )
        return connection

    @property
    def held(self) -> int:
        """Messages held for writing: queued, or in a transaction being written."""
        return self._held

    async def close(self) -> None:
        """Write what is queued, then stop the flushers."""
        self._closed = True
        self._wakeup.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._deadlines.stop()

    async def record(
        self,
        source: str,
        messages: Sequence[Message],
        headers: Mapping[str, str],
        body: bytes,
        content_type: str | None,
        *,
        processed: bool = False,
        searchable: bool = False,
    ) -> list[Recorded]:
        """Record `messages` (one request's) and return once they are committed.

        `processed`: the source has nothing to run, so they are stored processed already.
        `searchable`: the source's payloads are indexed for search (`search_payload`).
        """
        if self._closed:
            raise StoreUnavailable("shutting down")
        if self._held + len(messages) > self.max_queued:
            # Backpressure: a database that cannot keep up gets 503s, not an unbounded queue.
            raise StoreOverloaded("too many deliveries waiting for the database")
        loop = self._loop or asyncio.get_running_loop()  # not started: no flusher runs yet
        done: asyncio.Future[list[Recorded]] = loop.create_future()
        entry = _Entry(
            source, messages, dict(headers), body, content_type, processed, searchable, done
        )
        self._pending.append(entry)
        self._held += len(messages)
        self._wakeup.set()
        # Giving up ends the entry's future: a flusher that has not taken it yet drops it
        # unwritten; one already writing it may still commit it (the sender's retry is then a
        # duplicate).
        self._deadlines.watch(entry.done)
        return await entry.done

    def _take_batch(self) -> list[_Entry]:
        """The next entries to write, dropping those whose requests stopped waiting."""
        taken: list[_Entry] = []
        count = 0
        while self._pending:
            entry = self._pending[0]
            if entry.done.done():  # abandoned: nobody awaits its answer
                self._pending.popleft()
                self._held -= len(entry.messages)
                continue
            size = len(entry.messages)
            if taken and count + size > self.max_batch:
                break
            self._pending.popleft()
            taken.append(entry)
            count += size
        if not self._pending:
            self._wakeup.clear()
        return taken

    async def _flush_loop(self) -> None:
        connection: asyncpg.Connection | None = None
        try:
            while True:
                if not self._pending:
                    if self._closed:
                        return
                    await self._wakeup.wait()
                    continue
                batch = self._take_batch()
                try:
                    if connection is None or connection.is_closed():
                        async with translate_errors():
                            connection = await self._connect()
                    await self._write_isolating(connection, batch)
                except Exception as exc:
                    if connection is not None and is_unavailable(exc):
                        connection.terminate()
                        connection = None
                    self._fail(batch, exc)
                finally:
                    self._held -= sum(len(entry.messages) for entry in batch)
        finally:
            if connection is not None:
                connection.terminate()

    async def _write_isolating(self, pg: asyncpg.Connection, batch: list[_Entry]) -> None:
        """Write `batch` and answer its requests; a refused row fails only its own request.

        A refused row aborts the whole transaction, so the batch is halved and each half
        written again until the refused requests stand alone: one bad delivery among n
        requests costs about 2·log2(n) more transactions, and the others still commit.
        """
        try:
            results = await self._write(pg, batch)
        except Exception as exc:
            if not is_refusal(exc):
                raise
            if len(batch) == 1:
                self._refuse(batch[0], exc)
                return
            middle = len(batch) // 2
            await self._write_isolating(pg, batch[:middle])
            await self._write_isolating(pg, batch[middle:])
            return
        self._resolve(batch, results)

    @staticmethod
    def _refuse(entry: _Entry, exc: Exception) -> None:
        """Fail the one request whose rows the database refused."""
        failure = refused(exc)
        log.warning(
            "group commit refused a delivery",
            extra={"source": entry.source, "error": str(failure), "messages": len(entry.messages)},
        )
        if not entry.done.done():
            entry.done.set_exception(failure)

    @staticmethod
    def _fail(batch: list[_Entry], exc: Exception) -> None:
        """Fail every request of `batch` still waiting: none of their rows was committed."""
        if not isinstance(exc, StoreUnavailable):
            log.error("group commit failed", exc_info=exc, extra={"requests": len(batch)})
        for entry in batch:
            if entry.done.done():
                continue
            if isinstance(exc, StoreUnavailable):
                entry.done.set_exception(StoreUnavailable(str(exc)))
            else:
                # Not an unavailability (a bug, a schema out of date): a 500, never a 503
                # that would have the sender retry into the same error.
                failure = RuntimeError(f"group commit failed: {type(exc).__name__}")
                failure.__cause__ = exc
                entry.done.set_exception(failure)

    @staticmethod
    def _resolve(batch: list[_Entry], results: list[list[Recorded]]) -> None:
        for entry, recorded in zip(batch, results, strict=True):
            if not entry.done.done():
                entry.done.set_result(recorded)

    async def _write(self, pg: asyncpg.Connection, batch: list[_Entry]) -> list[list[Recorded]]:
        for attempt in range(3):
            try:
                async with translate_errors():
                    return await self._write_once(pg, batch)
            except _RETRYABLE:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @property
    def expects_conflicts(self) -> bool:
        """Whether batches are written with their redeliveries counted from the start, for a
        while after one met a key already stored (RECORD_BATCH rather than INSERT_BATCH)."""
        loop = self._loop
        return loop is not None and loop.time() < self._conflicts_until

    async def _insert(
        self, pg: asyncpg.Connection, document: str, bodies: list[bytes]
    ) -> list[asyncpg.Record]:
        try:
            return await self._insert_counting(pg, document, bodies)
        except asyncpg.exceptions.LockNotAvailableError:
            # A stored row of the batch stayed locked past LOCK_WAIT (a batch of handlers is
            # running its message): keep its redeliveries aside instead of waiting for it.
            self.deferred_batches += 1
            async with pg.transaction():
                await pg.execute("SET LOCAL lock_timeout = 0")
                written: list[asyncpg.Record] = await pg.fetch(
                    DEFER_BATCH, document, bodies, NOTIFY_CHANNEL
                )
            kept = len(bodies) - len(written)
            if kept:  # it met stored keys, not only a table's lock
                log.info(
                    "redeliveries kept aside: their messages' rows are held by running batches",
                    extra={"messages": kept},
                )
                if self._on_kept_aside is not None:
                    self._on_kept_aside(kept)
                self._met_stored_keys()
            return written

    async def _insert_counting(
        self, pg: asyncpg.Connection, document: str, bodies: list[bytes]
    ) -> list[asyncpg.Record]:
        """The batch with each redelivery counted on its stored row."""
        if not self.expects_conflicts:
            try:
                inserted: list[asyncpg.Record] = await pg.fetch(
                    INSERT_BATCH, document, bodies, NOTIFY_CHANNEL
                )
                return inserted
            except asyncpg.exceptions.UniqueViolationError:
                # A redelivery. The failed statement was rolled back whole: write it again.
                self.conflict_retries += 1
                if self._on_rewrite is not None:
                    self._on_rewrite()
        written: list[asyncpg.Record] = await pg.fetch(
            RECORD_BATCH, document, bodies, NOTIFY_CHANNEL
        )
        if not all(row["inserted"] for row in written):
            self._met_stored_keys()
        return written

    def _met_stored_keys(self) -> None:
        """A batch met stored keys: write batches counting redeliveries for the next window.
        Redeliveries keep the window open: a sender that keeps sending them costs one failed
        statement when it starts, not one a window."""
        loop = self._loop or asyncio.get_running_loop()
        self._conflicts_until = loop.time() + CONFLICT_WINDOW_SECONDS

    async def _write_once(
        self, pg: asyncpg.Connection, batch: list[_Entry]
    ) -> list[list[Recorded]]:
        # The first occurrence of each key in the batch is the one that may be inserted;
        # the others are duplicates whatever the statement finds.
        first: dict[tuple[str, str], tuple[_Entry, Message]] = {}
        received: dict[tuple[str, str], int] = {}
        for entry in batch:
            for message in entry.messages:
                key = (entry.source, message.message_id)
                if key in first:
                    received[key] += 1
                else:
                    first[key] = (entry, message)
                    received[key] = 1

        rows: list[tuple[Any, ...]] = []
        bodies: list[bytes] = []
        for key in lock_order(first):
            entry, message = first[key]
            trace_context = message.trace_context
            row: tuple[Any, ...] = (
                entry.source,
                message.message_id,
                message.event_type,
                entry.headers,
                message.content_type or entry.content_type,
                entry.processed,
                received[key],
                None if trace_context is None else dict(trace_context),
                message.ordering_key,
                entry.searchable,
            )
            rows.append(row)
            bodies.append(entry.body if message.body is None else message.body)
        try:
            document = orjson.dumps(rows).decode()
        except orjson.JSONEncodeError as exc:  # text JSON cannot hold (an unpaired surrogate)
            raise ValueError("a value cannot be encoded as JSON") from exc

        written = await self._insert(pg, document, bodies)
        ids = {(r["source"], r["message_id"]): int(r["id"]) for r in written if r["inserted"]}

        results: list[list[Recorded]] = []
        claimed: set[tuple[str, str]] = set()
        for entry in batch:
            recorded: list[Recorded] = []
            for message in entry.messages:
                key = (entry.source, message.message_id)
                row_id = ids.get(key)
                if row_id is not None and key not in claimed and first[key][1] is message:
                    claimed.add(key)
                    recorded.append(Recorded(message.message_id, "accepted", row_id))
                else:
                    recorded.append(Recorded(message.message_id, "duplicate", None))
            results.append(recorded)
        return results


def ingest_committer(
    engine: AsyncEngine, settings: Settings, metrics: Metrics | None = None
) -> GroupCommitter:
    """The group commit of a process that takes deliveries (HTTP ingest, a broker consumer),
    bounded by the settings' flushers, queue and timeouts."""
    return GroupCommitter(
        engine,
        flushers=settings.ingest_flushers,
        max_queued=settings.ingest_max_queued,
        wait_timeout=settings.db_timeout_seconds * 2,
        connect_timeout=settings.db_timeout_seconds,
        on_rewrite=None if metrics is None else metrics.ingest_batch_rewritten,
        on_kept_aside=None if metrics is None else metrics.ingest_redeliveries_kept_aside,
    )
