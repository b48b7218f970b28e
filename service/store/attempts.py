"""Recording attempts: each outcome on its message row and in `inbox_attempts`, each named
destination's part in `inbox_destinations`, in the batch's transaction or one of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.status import DUE, Status
from service.store.claims import BY_ID_PLANS, BY_ID_STATUS
from service.store.issues import RECORD_ISSUES
from service.store.results import AttemptResult, DestinationState, Fingerprint, MessageRow
from service.store.savepoints import MessageSavepoints, driver_of, driver_transaction

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
                   deferred boolean, keeps_error boolean, fingerprint text)
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
               u.error, u.traceback, u.duration_ms, u.per_destination, u.deferred, u.fingerprint
    ), released AS (
        DELETE FROM inbox_claims AS c USING finished WHERE c.message_id = finished.id
    ), recorded AS (
        INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome,
                                    error_type, error, traceback, duration_ms, actor,
                                    fingerprint)
        SELECT id, attempt, started_at, finished_at, outcome, error_type, error, traceback,
               duration_ms, $3, fingerprint
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
# gets no attempt row. `slot_at` is the slot of its rate limit's queue a deferred run holds
# (0020): every outcome writes it, so a run that ran, or waits for anything else, has none.
RECORD_DESTINATIONS = """
    WITH v AS (
        SELECT *
          FROM json_to_recordset($1::json) AS v(
                   id bigint, attempt int, source text, destination text, status text,
                   last_error text, started_at timestamptz, finished_at timestamptz,
                   outcome text, error_type text, error text, traceback text,
                   duration_ms float8, deferred boolean, slot_at timestamptz, fingerprint text)
         WHERE v.id = ANY($2::bigint[])
    ), marked AS (
        INSERT INTO inbox_destinations AS d (message_id, destination, source, status,
                                             attempts, last_error, updated_at, processed_at,
                                             slot_at)
        SELECT id, destination, source, status, CASE WHEN deferred THEN 0 ELSE 1 END,
               last_error, clock_timestamp(),
               CASE WHEN status = 'processed' THEN clock_timestamp() END, slot_at
          FROM v
            ON CONFLICT (message_id, destination) DO UPDATE
           SET status = CASE WHEN excluded.attempts = 0 THEN d.status ELSE excluded.status END,
               attempts = d.attempts + excluded.attempts,
               last_error = CASE WHEN excluded.attempts = 0
                                 THEN coalesce(d.last_error, excluded.last_error)
                                 ELSE excluded.last_error END,
               updated_at = excluded.updated_at,
               processed_at = excluded.processed_at,
               slot_at = excluded.slot_at
    )
    INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome,
                                error_type, error, traceback, duration_ms, actor, destination,
                                fingerprint)
    SELECT id, attempt, started_at, finished_at, outcome, error_type, error, traceback,
           duration_ms, $3, destination, fingerprint
      FROM v
     WHERE NOT v.deferred
"""

# Where each of a batch's messages stands with the destinations that have run for it: the
# attempts each has made, in all and before its budget began (0018), and the slot each
# deferred by its rate limit holds (0020).
LOAD_DESTINATIONS = """
    SELECT message_id, destination, status, attempts, budget_start, slot_at
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
        "fingerprint": _key(r.fingerprint),
    }


def _key(cause: Fingerprint | None) -> str | None:
    return None if cause is None else cause.key


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
                "slot_at": d.slot_at,
                "fingerprint": _key(d.fingerprint),
            }
            for r in results
            for d in r.destinations or ()
        ]
    ).decode()


@dataclass(slots=True)
class _Issue:
    cause: Fingerprint
    failed: int
    error: str | None
    traceback: str | None


def issues_document(results: Sequence[AttemptResult], finished: Set[int]) -> str | None:
    """The failures of `results` that were recorded (their id in `finished`; a deferral is
    none), counted by fingerprint with the last one's error as the sample, as RECORD_ISSUES
    reads them; None when there are none."""
    issues: dict[str, _Issue] = {}

    def count(cause: Fingerprint | None, error: str | None, tb: str | None) -> None:
        if cause is None:
            return
        issue = issues.get(cause.key)
        if issue is None:
            issues[cause.key] = _Issue(cause, 1, error, tb)
        else:
            issue.failed += 1
            issue.error, issue.traceback = error, tb or issue.traceback

    for r in results:
        if r.id not in finished:
            continue
        if r.destinations is not None:
            for d in r.destinations:
                if not d.deferred:
                    count(d.fingerprint, d.error, d.traceback)
        elif not r.deferred:
            count(r.fingerprint, r.error, r.traceback)
    if not issues:
        return None
    return orjson.dumps(
        [
            {
                "fingerprint": key,
                "source": issue.cause.source,
                "destination": issue.cause.destination,
                "handler": storable(issue.cause.handler),
                "error_type": storable(issue.cause.error_type),
                "frame": storable(issue.cause.frame),
                "detail": storable(issue.cause.detail),
                "failed": issue.failed,
                "error": storable(issue.error),
                "traceback": storable(issue.traceback),
            }
            for key, issue in sorted(issues.items())
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
    # The failures' issues, counted in the transaction that records their attempts.
    issues = issues_document(results, finished)
    if issues is not None:
        await driver.execute(RECORD_ISSUES, issues)
    return finished


async def load_destinations(conn: AsyncConnection, rows: Sequence[MessageRow]) -> None:
    """Set each row's `destinations` and `destination_states`: the named destinations that
    have run for it, where each stands, the attempts it has made and the slot it holds. In the
    batch's transaction, which holds the rows locked."""
    if not rows:
        return
    statuses: dict[int, dict[str, str]] = {row.id: {} for row in rows}
    states: dict[int, dict[str, DestinationState]] = {row.id: {} for row in rows}
    driver = await driver_of(conn)
    for record in await driver.fetch(LOAD_DESTINATIONS, list(statuses)):
        statuses[record[0]][record[1]] = record[2]
        states[record[0]][record[1]] = DestinationState(record[3], record[4], record[5])
    for row in rows:
        row.destinations = statuses[row.id]
        row.destination_states = states[row.id]


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
    driver = await driver_of(conn)
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
