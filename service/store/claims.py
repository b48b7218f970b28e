"""The worker's SQL: claim due messages (each claim a lease), record attempts, reap claims."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.schema import DUE, Status
from service.store.due import (
    ALONE_DUE_SQL,
    CLAIM_ALONE,
    CLAIM_DUE,
    CLAIM_KEYED,
    KEYED_SOURCES,
    LOCK_DUE,
    LOCK_KEYED,
)
from service.store.errors import translate_errors


# MessageRow and AttemptResult are made for every message run: slotted, not frozen, since a
# frozen dataclass sets each field through object.__setattr__ (service/sources/base.py).
@dataclass(slots=True)
class MessageRow:
    """A message as the worker (or sync ingest) runs it; `attempts` = attempts made before,
    `budget_start` = attempts made before its current attempt budget began (an admin retry)."""

    id: int
    source: str
    message_id: str
    event_type: str | None
    attempts: int
    headers: dict[str, str]
    body: bytes
    content_type: str | None
    # The delivery span's W3C trace context, for the attempt's span (None: none stored).
    trace_context: Mapping[str, str] | None = None
    budget_start: int = 0
    # Of a source with named destinations: each destination that has run for the message,
    # and its status (`load_destinations`); empty when none has.
    destinations: dict[str, str] | None = None
    # Its source's ordering key's value (None: it has none), and its status when claimed
    # (what it returns to when its run is deferred, `processing.ordering`).
    ordering_key: str | None = None
    status: Status = Status.PENDING


@dataclass(slots=True)
class DestinationResult:
    """How one named destination's part of an attempt ended."""

    name: str
    status: Status  # processed, retrying or dead
    outcome: str
    started_at: datetime
    finished_at: datetime
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    delay_seconds: float | None = None  # retrying: when this destination would run next
    # It did not run: its rate limit or circuit breaker held it (`processing.gates`). It
    # stays pending (or retrying), no attempt spent, due again after `delay_seconds`.
    deferred: bool = False
    # Deferred by the endpoint's own answer (a 429 or 503 with `Retry-After`,
    # `processing.forward`), not by a gate: the answer is its error, shown as last_error.
    retry_after: bool = False

    @property
    def duration_ms(self) -> float:
        return round((self.finished_at - self.started_at).total_seconds() * 1000, 3)


@dataclass(slots=True)
class AttemptResult:
    """How one attempt ended, to be written to the message row and inbox_attempts."""

    id: int
    attempt: int
    status: Status  # processed, retrying or dead
    outcome: str  # inbox_attempts.outcome
    started_at: datetime
    finished_at: datetime
    delay_seconds: float | None = None
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    # The attempt never finished (its claim expired): the message's next attempt runs alone.
    unfinished: bool = False
    # Of a source with named destinations, each destination the attempt ran: recorded as an
    # attempt each (`record_destinations`), instead of one of the whole message.
    destinations: list[DestinationResult] | None = None
    # Every destination due was deferred: nothing ran, and the attempt counted when the
    # message was claimed is given back.
    deferred: bool = False
    # Deferred by the endpoint's `Retry-After`: unlike a gate's or its key's deferral, it
    # replaces the message's last_error, so that an operator sees why the message waits.
    retry_after: bool = False

    @property
    def duration_ms(self) -> float:
        return round((self.finished_at - self.started_at).total_seconds() * 1000, 3)


SAVEPOINT = "inbox_message"
# A cancel request for another backend: a no-op if it is idle, else its statement fails.
CANCEL_BACKEND = text("SELECT pg_cancel_backend(:pid)")


class MessageSavepoints:
    """One SAVEPOINT per message, issued on the driver's connection under one fixed name.

    SQLAlchemy's nested transactions name each savepoint afresh (sa_savepoint_1, _2, ...) and
    send SAVEPOINT and RELEASE as prepared statements: two round trips per message, plus a
    Parse of each new name, and a batch's 200 names flush the connection's statement cache
    (the handlers' own statements with them). Here they are plain simple-query commands, and
    a message's RELEASE (or ROLLBACK TO) waits to share a round trip with the next message's
    SAVEPOINT or with `flush()`: one round trip per message instead of four or more.
    """

    def __init__(self, driver: asyncpg.Connection, engine: AsyncEngine) -> None:
        self._driver = driver
        self._engine = engine
        self._pending = ""
        self._timeout_set = False
        self._limit_ms: int | None = None  # set by limit_statements, for the transaction

    @property
    def driver(self) -> asyncpg.Connection:
        """The driver connection of the batch's transaction, for statements of the inbox's own
        (`StagedRows.write`): send `flush()` first if a release or rollback may be pending."""
        return self._driver

    async def begin(self, statement_timeout_ms: int | None = None) -> None:
        """Open the next message's savepoint (ending the previous one's in the same trip).

        `statement_timeout_ms` bounds each of the message's statements on the server, so a
        handler stuck in one (a lock wait, `pg_sleep`) is cancelled there, not only abandoned
        by its client; a ROLLBACK TO the savepoint undoes the setting with the rest.
        """
        if not self._driver.is_in_transaction():
            raise RuntimeError("a message savepoint needs the batch's transaction to have begun")
        command = self._pending + f"SAVEPOINT {SAVEPOINT}"
        if statement_timeout_ms is not None:
            command += f"; SET LOCAL statement_timeout = {int(statement_timeout_ms)}"
            self._timeout_set = True
        self._pending = ""
        await self._driver.execute(command)

    async def limit_statements(self, statement_timeout_ms: int) -> None:
        """Without a savepoint (an optimistic batch, which a failure rolls back whole): bound
        the transaction's statements, sending the setting only when it changes."""
        if self._limit_ms == statement_timeout_ms:
            return
        command = self._pending + f"SET LOCAL statement_timeout = {int(statement_timeout_ms)}"
        self._pending = ""
        await self._driver.execute(command)
        self._limit_ms = statement_timeout_ms

    def defer(self, command: str) -> None:
        """Send `command` (a fixed one) with the next trip, before anything a handler sends."""
        self._pending += f"{command}; "

    def release(self) -> None:
        """Keep the message's effects (sent with the next begin or flush)."""
        self._pending = f"RELEASE SAVEPOINT {SAVEPOINT}; "

    def rollback(self) -> None:
        """Undo the message's effects (sent with the next begin or flush). Until then nothing
        else may run on the connection: an aborted transaction refuses every other statement.
        """
        self._pending = f"ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}; "

    async def cancel_statement(self) -> None:
        """Cancel the statement running on this connection, if one is, from another connection
        (the server answers it with an error; the transaction survives to its savepoint)."""
        async with translate_errors(), self._engine.connect() as other:
            await other.execute(CANCEL_BACKEND, {"pid": self._driver.get_server_pid()})

    async def flush(self) -> None:
        """Send a pending release or rollback now (before the batch's own statements), and
        lift the last message's statement timeout off them."""
        command, self._pending = self._pending, ""
        if self._timeout_set or self._limit_ms is not None:
            command += "SET LOCAL statement_timeout TO DEFAULT"
            self._timeout_set = False
            self._limit_ms = None
        if command:
            await self._driver.execute(command)


async def _driver(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under `conn`, for statements SQLAlchemy need not process."""
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, asyncpg.Connection)
    return driver


async def message_savepoints(conn: AsyncConnection) -> MessageSavepoints:
    """Savepoints on `conn`'s driver connection; its transaction must have begun already."""
    return MessageSavepoints(await _driver(conn), conn.engine)


@asynccontextmanager
async def batch_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction committed when the block exits normally, rolled back otherwise."""
    async with translate_errors(), engine.connect() as conn, conn.begin():
        yield conn


# The claim's plan must not depend on statistics. A backlog the planner has not seen yet (a
# fresh table; a burst from a source that was rare when the table was last analyzed, as after
# an outage) is estimated at a few rows, and the planner then ANDs the due index with the
# source index into a bitmap and sorts every due row to return the first `limit`: 25-40 ms per
# claim of 100 from a 40,000-message backlog, growing with it, against 4 ms by the due index.
# Disabling sorts for the claim's transaction leaves that index walk as the only plan. The
# reaper's transaction does the same for the lease index (NO_SORTS).
_NO_SORTS = "SET LOCAL enable_sort TO off"
CLAIM_BEGIN = f"BEGIN; {_NO_SORTS}"
NO_SORTS = text(_NO_SORTS)


def keyed_share(
    sources: Sequence[str], keyed: Collection[str], limit: int
) -> tuple[list[str], int]:
    """The sources of `sources` whose keyed messages a claim of `limit` looks for, and how
    many of it they may take: all of it when every source is keyed, else half, so that
    neither a hot key nor a flood of unkeyed messages starves the other."""
    mine = [name for name in sources if name in keyed]
    if not mine:
        return [], 0
    return mine, limit if len(mine) == len(sources) else max(1, limit // 2)


async def claim_due(
    engine: AsyncEngine,
    leases: Mapping[str, float],
    limit: int,
    *,
    alone: bool = False,
    keyed: Collection[str] = (),
) -> list[MessageRow]:
    """Lease up to `limit` due messages of the sources in `leases` (seconds each), in id order.

    Committed at once (in a transaction of its own): the attempts count up by one before
    anything runs. `alone`: claim among the messages whose last attempt never finished.
    `keyed`: the sources that may hold messages with an ordering key, claimed from their
    keys' heads (`due.keyed_runs`), the rest from the due index.
    Sent on the driver connection: the batch's rows are built straight from asyncpg's records
    (its JSONB codec, set up by the dialect, decodes `headers`), not through SQLAlchemy's
    result rows.
    """
    names, seconds = list(leases), list(leases.values())
    ordered, share = ([], 0) if alone else keyed_share(names, keyed, limit)
    async with driver_transaction(engine, CLAIM_BEGIN) as driver:
        records = []
        if ordered:
            records = await driver.fetch(CLAIM_KEYED, ordered, [leases[n] for n in ordered], share)
        if len(records) < limit:
            records += await driver.fetch(
                CLAIM_ALONE if alone else CLAIM_DUE, names, seconds, limit - len(records)
            )
    return sorted((message_row(r) for r in records), key=lambda row: row.id)


@asynccontextmanager
async def driver_transaction(engine: AsyncEngine, begin: str) -> AsyncIterator[asyncpg.Connection]:
    """A transaction on a pooled connection's driver, opened by `begin` (BEGIN and whatever
    settings go with it, in one trip) and committed when the block exits normally."""
    async with translate_errors(), engine.connect() as conn:
        driver = await _driver(conn)
        # SQLAlchemy has sent nothing on `conn`: this transaction is the driver's alone.
        try:
            await driver.execute(begin)
            yield driver
            await driver.execute("COMMIT")
        except BaseException:
            # Where the transaction stands is unknown (a statement failed, or this task was
            # cancelled mid-trip): the connection must not go back to the pool with it open.
            await conn.invalidate()
            raise


def message_row(r: asyncpg.Record) -> MessageRow:
    """A claim's record (its first twelve columns, `due.ROW_COLUMNS` and the status it was
    claimed in) as a MessageRow."""
    return MessageRow(
        id=r[0],
        source=r[1],
        message_id=r[2],
        event_type=r[3],
        attempts=r[4],
        headers=r[5] or {},
        body=r[6],
        content_type=r[7],
        trace_context=r[8],
        budget_start=r[9],
        ordering_key=r[10],
        status=Status(r[11]),
    )


# The rows of a batch are found by id, on the primary key, never through an index on `status`:
# the batch's own statements compare `(m.status || '')`, which no index can answer. On the
# column, the planner (which sees few `processing` rows, rightly) walks the status index's
# `processing` range instead, and that range keeps an entry for every claim made since the
# last VACUUM. With no vacuum in between (PostgreSQL 15, batches of 100), the hold and the
# finish of a batch took the server 2.4 ms of CPU after 25,000 messages and 3.9 ms after
# 150,000; by id, 2.0-2.2 ms throughout.
BY_ID_STATUS = "(m.status || '')"

# The statements on a batch's rows find each by id, on the primary key (a nested loop over the
# batch), whatever size the planner believes the table to be. Left to its statistics, a plan
# made while the table was small (a fresh inbox, after a TRUNCATE, before autovacuum first
# analyzes it) reads the whole table and hash-joins the batch's rows instead, and a prepared
# statement keeps its generic plan until the next ANALYZE, however much the table grows
# meanwhile: at 2,500 deliveries/s for 15 s into an empty inbox, the finishes read 21 million
# rows in 1,334 sequential scans, and PostgreSQL spent 12-16 s of CPU on the 37,500 messages.
# Disabling sequential scans alone is not enough (a full scan of the primary key, hash-joined,
# is the small table's plan then), nor is planning every execution afresh (with small rows,
# 20,000 of them still cost less to scan than 100 probes, by the planner's reckoning). Set in
# the transaction of the statements that need it, which restores the defaults before any
# handler runs (RESTORE_PLANS) or ends after them. Every execution of those statements runs
# under it, so a generic plan is made under it too (a cached plan ignores later settings).
# One statement, which a prepared statement may be too.
BY_ID_PLANS = (
    "SELECT set_config('enable_seqscan', 'off', true), "
    "set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
)

# The fence before handlers run: lock the claimed rows this attempt still owns (status and
# attempts as claimed). A row whose lease expired and was reaped, or claimed again, is left
# out, so a late attempt never commits its effects over a newer one. Once locked, a row is
# skipped by the reaper and by other claims until this transaction ends, however long it runs.
HOLD_CLAIMED = text(
    f"""
    SELECT m.id
      FROM inbox_messages AS m
      JOIN unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[])) AS c(id, attempts)
        ON m.id = c.id
     WHERE {BY_ID_STATUS} = 'processing'
       AND m.attempts = c.attempts
     ORDER BY m.id
       FOR UPDATE OF m
    """  # noqa: S608 - a fixed expression, no input
)


async def hold_claimed(
    conn: AsyncConnection, rows: Sequence[MessageRow], *, leased: bool = True
) -> set[int]:
    """Lock `rows` for this transaction; the ids still owned by their claimed attempt.

    `leased`: claimed by `claim_due` (HOLD_CLAIMED); otherwise by `lock_due` and
    `record_claims`, a batch that runs again (HOLD_LOCKED). The transaction is left planning
    by id (BY_ID_PLANS): the caller restores the defaults (RESTORE_PLANS) before any handler
    runs.
    """
    params = {"ids": [r.id for r in rows], "attempts": [r.attempts + 1 for r in rows]}
    await conn.execute(text(BY_ID_PLANS))
    return {r.id for r in await conn.execute(HOLD_CLAIMED if leased else HOLD_LOCKED, params)}


# What a batch's transaction sends before any handler runs: its own statements' planner
# settings (NO_SORTS, BY_ID_PLANS) are the inbox's, not the handlers'.
RESTORE_PLANS = (
    "SET LOCAL enable_sort TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT; "
    "SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT"
)


@dataclass(frozen=True)
class LockedBatch:
    """What `lock_due` locked: the rows to run, and those whose last attempt never finished."""

    rows: list[MessageRow]
    abandoned: list[MessageRow]


async def lock_due(
    conn: AsyncConnection, sources: Sequence[str], limit: int, *, keyed: Collection[str] = ()
) -> LockedBatch:
    """Lock up to `limit` due messages of `sources` in `conn`'s transaction (which this begins:
    call it first), in id order. `keyed`: as for `claim_due`.

    The claim's plan is the due index's (see NO_SORTS): sorts are left disabled, and the
    caller must restore them (RESTORE_PLANS, `MessageSavepoints.defer`) before any handler
    runs a statement in the transaction.
    """
    await conn.execute(NO_SORTS)
    driver = await _driver(conn)
    ordered, share = keyed_share(sources, keyed, limit)
    records = await driver.fetch(LOCK_KEYED, ordered, share) if ordered else []
    if len(records) < limit:
        records += await driver.fetch(LOCK_DUE, list(sources), limit - len(records))
    rows: list[MessageRow] = []
    abandoned: list[MessageRow] = []
    for r in sorted(records, key=lambda r: r[0]):
        (abandoned if r[12] else rows).append(message_row(r))
    return LockedBatch(rows, abandoned)


# The attempts of a locked batch, each with its lease (seconds), committed on its own. A claim
# left by an earlier attempt is taken over: the batch holds the message's lock.
RECORD_CLAIMS = """
    INSERT INTO inbox_claims AS c (message_id, attempt, locked_until, actor)
    SELECT id, attempt, clock_timestamp() + lease * interval '1 second', $4
      FROM unnest($1::bigint[], $2::int[], $3::float8[]) AS u(id, attempt, lease)
        ON CONFLICT (message_id) DO UPDATE
       SET attempt = excluded.attempt, locked_until = excluded.locked_until,
           actor = excluded.actor
"""


async def record_claims(
    engine: AsyncEngine, rows: Sequence[MessageRow], leases: Mapping[str, float], actor: str
) -> None:
    """Count the attempts of `rows` (locked by a batch's transaction on another connection of
    `engine`'s pool), committed before this returns."""
    if not rows:
        return
    async with translate_errors(), engine.connect() as conn:
        driver = await _driver(conn)
        await driver.execute(
            RECORD_CLAIMS,
            [r.id for r in rows],
            [r.attempts + 1 for r in rows],
            [leases[r.source] for r in rows],
            actor,
        )


# What the admin shows: a message claimed by a batch of Python handlers is `processing`, with
# its attempt counted, as a leased one is, though its row stays `pending` or `retrying` (and
# its `attempts` as they were) until the batch commits. The claims (a few hundred rows at
# most) are hashed once per query. Over `inbox_messages`, unaliased.
_CLAIMED = (
    "status IN ('pending', 'retrying') AND (id, attempts + 1) IN "
    "(SELECT c.message_id, c.attempt FROM inbox_claims AS c)"
)
SHOWN_STATUS = f"CASE WHEN {_CLAIMED} THEN 'processing' ELSE status END"
# The ids of the claimed messages, for a listing of `processing` ones: through the primary key.
CLAIMED_IDS = "SELECT c.message_id FROM inbox_claims AS c"
SHOWN_ATTEMPTS = f"CASE WHEN {_CLAIMED} THEN attempts + 1 ELSE attempts END"


# A locked batch's rerun (after its optimistic run rolled back): lock again the rows whose
# claim is still this attempt's (`attempts`: the attempt's number, as for HOLD_CLAIMED). A row
# whose claim expired and was taken over is left out.
HOLD_LOCKED = text(
    f"""
    SELECT m.id
      FROM inbox_messages AS m
      JOIN unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[])) AS c(id, attempts)
        ON m.id = c.id
      JOIN inbox_claims AS k ON k.message_id = m.id AND k.attempt = c.attempts
     WHERE {BY_ID_STATUS} IN ('pending', 'retrying')
       AND m.attempts = c.attempts - 1
     ORDER BY m.id
       FOR UPDATE OF m
    """  # noqa: S608 - a fixed expression, no input
)


ALONE_DUE = text(ALONE_DUE_SQL)


async def keyed_sources(engine: AsyncEngine, sources: Sequence[str]) -> set[str]:
    """Those of `sources` that hold unfinished messages with an ordering key."""
    async with translate_errors(), engine.connect() as conn:
        driver = await _driver(conn)
        return {r[0] for r in await driver.fetch(KEYED_SOURCES, list(sources))}


async def alone_due(engine: AsyncEngine, sources: Sequence[str]) -> bool:
    async with translate_errors(), engine.connect() as conn:
        return bool((await conn.execute(ALONE_DUE, {"sources": list(sources)})).scalar())


# One round trip records a whole batch: the status update, the attempt rows, and the release of
# the batch's claims (inbox_claims, for the messages claimed by `lock_due`). The update is
# fenced on the attempts count and status the caller saw, so the outcome of a lease that expired
# and was claimed again by someone else is dropped instead of overwriting the newer attempt.
# An attempt that finished clears `run_alone`; one reaped unfinished sets it. A deferred one
# (a rate limit, a breaker or its ordering key held it: it did not run; or the endpoint's
# Retry-After asked it to wait) gives its attempt back and writes no attempt row; it keeps its
# last error unless the endpoint's answer is the reason it waits (`keeps_error` false). The outcomes
# travel as one JSON document ($1), not as fourteen arrays: asyncpg checks every array element
# against three abstract base classes, which made recording 100 outcomes cost the worker about
# 20 us a message against 8. The rows are found by id (BY_ID_STATUS).
FINISH_ATTEMPTS = f"""
    WITH u AS (
        SELECT *
          FROM json_to_recordset($1::json) AS u(
                   id bigint, status text, attempt int, expected int, delay float8,
                   last_error text, unfinished boolean, started_at timestamptz,
                   finished_at timestamptz, outcome text, error_type text, error text,
                   traceback text, duration_ms float8, per_destination boolean,
                   deferred boolean, keeps_error boolean)
    ), finished AS (
        UPDATE inbox_messages AS m
           SET status = u.status,
               attempts = u.attempt,
               next_attempt_at = CASE WHEN u.status = 'retrying' OR u.deferred
                                      THEN clock_timestamp() + u.delay * interval '1 second'
                                      ELSE m.next_attempt_at END,
               processed_at = CASE WHEN u.status = 'processed' THEN clock_timestamp() END,
               locked_until = NULL,
               last_error = CASE WHEN u.keeps_error THEN m.last_error ELSE u.last_error END,
               run_alone = u.unfinished
          FROM u
         WHERE m.id = u.id
           AND m.attempts = u.expected
           AND {BY_ID_STATUS} = ANY($2::text[])
     RETURNING m.id, u.attempt, u.started_at, u.finished_at, u.outcome, u.error_type,
               u.error, u.traceback, u.duration_ms, u.per_destination, u.deferred
    ), released AS (
        DELETE FROM inbox_claims AS c USING finished WHERE c.message_id = finished.id
    ), recorded AS (
        INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome,
                                    error_type, error, traceback, duration_ms, actor)
        SELECT id, attempt, started_at, finished_at, outcome, error_type, error, traceback,
               duration_ms, $3
          FROM finished
         WHERE per_destination IS NOT TRUE AND NOT deferred
    )
    SELECT id FROM finished
"""  # noqa: S608 - a fixed expression, no input

# Each named destination an attempt ran, for the messages FINISH_ATTEMPTS updated ($2): its
# row's status and attempts, and an attempt row naming it. In the batch's transaction, so a
# destination's processed mark commits with its effects. A deferred destination (its rate
# limit or breaker held it) did not run: its row is made pending if it has none, so that the
# message runs it when it comes due again, and it keeps its status and attempts otherwise; it
# gets no attempt row.
RECORD_DESTINATIONS = """
    WITH v AS (
        SELECT *
          FROM json_to_recordset($1::json) AS v(
                   id bigint, attempt int, source text, destination text, status text,
                   last_error text, started_at timestamptz, finished_at timestamptz,
                   outcome text, error_type text, error text, traceback text,
                   duration_ms float8, deferred boolean)
         WHERE v.id = ANY($2::bigint[])
    ), marked AS (
        INSERT INTO inbox_destinations AS d (message_id, destination, source, status,
                                             attempts, last_error, updated_at, processed_at)
        SELECT id, destination, source, status, CASE WHEN deferred THEN 0 ELSE 1 END,
               last_error, clock_timestamp(),
               CASE WHEN status = 'processed' THEN clock_timestamp() END
          FROM v
            ON CONFLICT (message_id, destination) DO UPDATE
           SET status = CASE WHEN excluded.attempts = 0 THEN d.status ELSE excluded.status END,
               attempts = d.attempts + excluded.attempts,
               last_error = CASE WHEN excluded.attempts = 0
                                 THEN coalesce(d.last_error, excluded.last_error)
                                 ELSE excluded.last_error END,
               updated_at = excluded.updated_at,
               processed_at = excluded.processed_at
    )
    INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome,
                                error_type, error, traceback, duration_ms, actor, destination)
    SELECT id, attempt, started_at, finished_at, outcome, error_type, error, traceback,
           duration_ms, $3, destination
      FROM v
     WHERE NOT v.deferred
"""

# Where each of a batch's messages stands with the destinations that have run for it.
LOAD_DESTINATIONS = """
    SELECT message_id, destination, status
      FROM inbox_destinations
     WHERE message_id = ANY($1::bigint[])
"""

UNLEASED = [status.value for status in DUE]
LEASED = [Status.PROCESSING.value]


def outcomes_document(results: Sequence[AttemptResult], leased: bool) -> str:
    """`results` as FINISH_ATTEMPTS reads them. `leased`: their attempts were counted when the
    rows were claimed; otherwise (rows inserted by this transaction, or locked by `lock_due`)
    each counts now."""
    return orjson.dumps([_outcome(r, leased) for r in results]).decode()


def _outcome(r: AttemptResult, leased: bool) -> dict[str, object]:
    error_type, error = storable(r.error_type), storable(r.error)
    return {
        "id": r.id,
        "status": r.status,
        "attempt": r.attempt - 1 if r.deferred else r.attempt,
        "expected": r.attempt if leased else r.attempt - 1,
        "deferred": r.deferred,
        "keeps_error": r.deferred and not r.retry_after,
        "delay": r.delay_seconds,
        "last_error": None if r.status == Status.PROCESSED else last_error_line(error_type, error),
        "unfinished": r.unfinished,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "outcome": r.outcome,
        "error_type": error_type,
        "error": error,
        "traceback": storable(r.traceback),
        "duration_ms": r.duration_ms,
        "per_destination": r.destinations is not None,
    }


def destinations_document(results: Sequence[AttemptResult], sources: Mapping[int, str]) -> str:
    """The destinations of `results` as RECORD_DESTINATIONS reads them."""
    return orjson.dumps(
        [
            {
                "id": r.id,
                "attempt": r.attempt,
                "source": sources[r.id],
                "destination": d.name,
                "status": d.status,
                "last_error": None
                if d.status == Status.PROCESSED
                else last_error_line(storable(d.error_type), storable(d.error)),
                "started_at": d.started_at,
                "finished_at": d.finished_at,
                "outcome": d.outcome,
                "error_type": storable(d.error_type),
                "error": storable(d.error),
                "traceback": storable(d.traceback),
                "duration_ms": d.duration_ms,
                "deferred": d.deferred,
            }
            for r in results
            for d in r.destinations or ()
        ]
    ).decode()


async def _finish(
    driver: asyncpg.Connection,
    results: Sequence[AttemptResult],
    actor: str,
    leased: bool,
    sources: Mapping[int, str] | None = None,
) -> set[int]:
    rows = await driver.fetch(
        FINISH_ATTEMPTS, outcomes_document(results, leased), LEASED if leased else UNLEASED, actor
    )
    finished = {row[0] for row in rows}
    fanned = [r for r in results if r.destinations and r.id in finished]
    if fanned:
        if sources is None:
            raise RuntimeError("recording destinations needs each message's source")
        await driver.execute(
            RECORD_DESTINATIONS, destinations_document(fanned, sources), list(finished), actor
        )
    return finished


async def load_destinations(conn: AsyncConnection, rows: Sequence[MessageRow]) -> None:
    """Set each row's `destinations`: the named destinations that have run for it, and where
    each stands. In the batch's transaction, which holds the rows locked."""
    if not rows:
        return
    states: dict[int, dict[str, str]] = {row.id: {} for row in rows}
    driver = await _driver(conn)
    for record in await driver.fetch(LOAD_DESTINATIONS, list(states)):
        states[record[0]][record[1]] = record[2]
    for row in rows:
        row.destinations = states[row.id]


async def finish_attempts(
    conn: AsyncConnection,
    results: Sequence[AttemptResult],
    actor: str,
    *,
    leased: bool = False,
    savepoints: MessageSavepoints | None = None,
    sources: Mapping[int, str] | None = None,
) -> set[int]:
    """Write `results` in `conn`'s transaction; the ids actually updated (a lost lease is left
    out). The transaction must have begun on the server (a statement ran in it already): the
    statement goes to the driver connection, which SQLAlchemy has not told of a lazy BEGIN.

    `leased`: the attempts were counted on the rows when they were claimed (`claim_due`);
    otherwise the rows were inserted by this transaction (sync mode) or locked by it
    (`lock_due`, their attempts counted as claims), and the attempt counts now.
    `savepoints`: the batch's, whose pending commands are sent first, in the same round trip
    as BY_ID_PLANS (which stays set: the transaction must end after this). `sources`: each
    message's source, by id, needed when a result names destinations.
    """
    if savepoints is not None:
        savepoints.defer(BY_ID_PLANS)
        await savepoints.flush()
    driver = await _driver(conn)
    if not driver.is_in_transaction():
        raise RuntimeError("finish_attempts needs its transaction to have begun")
    if not results:
        return set()
    if savepoints is None:
        await driver.execute(BY_ID_PLANS)
    return await _finish(driver, results, actor, leased, sources)


def storable(text: str | None) -> str | None:
    """`text` as PostgreSQL's text can hold it: a NUL written out as `\\x00`, as repr() does,
    and a lone surrogate (which is not UTF-8) as its escape.

    An error message can carry either from a delivery's payload (`ValueError(payload["x"])`),
    and the server refuses the whole statement for it: every attempt of the batch would fail
    to be recorded, again on each retry.
    """
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


def last_error_line(error_type: str | None, error: str | None) -> str | None:
    """The message row's `last_error`: the error's type and message in one line."""
    if error_type is None:
        return error
    return f"{error_type}: {error}" if error else error_type


async def record_results(
    engine: AsyncEngine, results: Sequence[AttemptResult], actor: str, *, leased: bool
) -> set[int]:
    """`finish_attempts` in a transaction of its own."""
    if not results:
        return set()
    async with driver_transaction(engine, f"BEGIN; {BY_ID_PLANS}") as driver:
        return await _finish(driver, results, actor, leased)


# Leases whose holder is gone (killed, partitioned, or just too slow): SKIP LOCKED so that
# several workers reaping at once split them; each is then finished as an abandoned attempt.
# Of every source, configured in this worker or not: the claim of a source removed from the
# config since would otherwise show `processing` for good, as no worker claims its rows.
EXPIRED_LEASES = text(
    """
    SELECT id, source, attempts, budget_start
      FROM inbox_messages
     WHERE status = 'processing'
       AND locked_until < now()
     ORDER BY locked_until
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
    """
)


@dataclass(frozen=True)
class ExpiredLease:
    """A claim whose holder is gone; `attempts` counts the attempt it never finished."""

    id: int
    source: str
    attempts: int
    budget_start: int


async def expired_leases(conn: AsyncConnection, limit: int) -> list[ExpiredLease]:
    """Lock up to `limit` expired leases (in the oldest first order of the lease index)."""
    await conn.execute(NO_SORTS)
    rows = await conn.execute(EXPIRED_LEASES, {"limit": limit})
    return [ExpiredLease(r.id, r.source, r.attempts, r.budget_start) for r in rows]


# Expired claims of Python handler batches (`inbox_claims`) of sources other than `:sources`.
# The next batch of a configured source records its own (LOCK_DUE), but no batch comes for a
# source removed from the config since, and its message would show `processing` for good
# (SHOWN_STATUS). Locked as LOCK_DUE locks them: a batch that still holds its row, running past
# its claim, is passed over. `inbox_claims` holds a few hundred rows at most.
EXPIRED_CLAIMS = text(
    """
    SELECT m.id, m.source, m.attempts, m.budget_start
      FROM inbox_claims AS c
      JOIN inbox_messages AS m ON m.id = c.message_id AND c.attempt > m.attempts
     WHERE c.locked_until < now()
       AND m.status IN ('pending', 'retrying')
       AND m.source <> ALL(CAST(:sources AS text[]))
     LIMIT :limit
       FOR UPDATE OF m SKIP LOCKED
    """
)


async def expired_claims_of_other_sources(
    conn: AsyncConnection, sources: Sequence[str], limit: int
) -> list[ExpiredLease]:
    """Lock up to `limit` messages with an expired claim whose source is not in `sources`; to
    be finished with `finish_attempts(..., leased=False)`, which releases their claims."""
    rows = await conn.execute(EXPIRED_CLAIMS, {"sources": list(sources), "limit": limit})
    # The claimed attempt is not counted on the row yet: it is the one after `attempts`.
    return [ExpiredLease(r.id, r.source, r.attempts + 1, r.budget_start) for r in rows]


@asynccontextmanager
async def short_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction for bookkeeping only (no handler runs in it)."""
    async with translate_errors(), engine.begin() as conn:
        yield conn
