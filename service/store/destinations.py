"""The admin's SQL over named destinations: each (message, destination) pair's state, its
retry, replay and discard, a replay to one destination in bulk, and the counts per destination.

An action on one pair leaves the message's other destinations as they are; the message's row
keeps the summary of its destinations (`summary_status`), and goes back to `pending` whenever
one of them is to run again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.schema import Status
from service.core.status import summary_status
from service.store.admin import (
    ADMIN_DISCARD,
    ADMIN_REPLAY,
    ADMIN_RETRY,
    BULK_BATCH_SIZE,
    GET_MESSAGE,
    RESET_TO_PENDING,
    SUMMARY_COLUMNS,
    BulkRetryResult,
    InvalidTransition,
    MessageFilter,
    lock_message,
    move_matching_to_pending,
    where_sql,
)
from service.store.errors import translate_errors
from service.store.notifications import NOTIFY

# A pair to run again: its row made `pending` (made, if the destination never ran for the
# message: a replay to a destination added since).
PAIR_PENDING = text(
    """
    INSERT INTO inbox_destinations AS d (message_id, destination, source, status)
    VALUES (:id, :destination, :source, 'pending')
        ON CONFLICT (message_id, destination) DO UPDATE
       SET status = 'pending', budget_start = d.attempts, updated_at = now(),
           processed_at = NULL
    """
)
PAIR_DISCARDED = text(
    """
    UPDATE inbox_destinations SET status = 'discarded', updated_at = now()
     WHERE message_id = :id AND destination = :destination
    """
)
PAIR_STATUS = text(
    "SELECT status FROM inbox_destinations WHERE message_id = :id AND destination = :destination"
)
PAIR_STATUSES = text("SELECT status FROM inbox_destinations WHERE message_id = :id")
SET_SUMMARY = text(
    f"""
    UPDATE inbox_messages
       SET status = :status, locked_until = NULL,
           processed_at = CASE WHEN :status = 'processed' THEN now() ELSE processed_at END
     WHERE id = :id
    RETURNING {SUMMARY_COLUMNS}
    """  # noqa: S608
)
RECORD_PAIR_ACTION = text(
    """
    INSERT INTO inbox_attempts
           (message_id, attempt, started_at, finished_at, outcome, actor, destination)
    VALUES (:id, :attempt, now(), now(), :outcome, :actor, :destination)
    """
)


class UnknownDestination(Exception):
    """The message's source has no such destination, nor has one of that name run for it."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def check_known(
    known: Mapping[str, Collection[str]],
    source: str,
    message_id: int,
    destination: str,
    pair: str | None,
) -> None:
    if pair is None and destination not in known.get(source, ()):
        names = ", ".join(sorted(known.get(source, ()))) or "none"
        raise UnknownDestination(
            f"message {message_id}'s source {source} has no destination {destination} "
            f"(its destinations: {names})"
        )


async def retry_destination(
    engine: AsyncEngine,
    message_id: int,
    destination: str,
    actor: str,
    force: bool,
    known: Mapping[str, Collection[str]],
) -> tuple[dict[str, Any], str]:
    """Run one destination of a message again: a retry of a retrying, dead or discarded pair,
    a replay (`force`) of a processed one or of one that never ran for the message. The
    message goes back to `pending` with a fresh attempt budget; its other pairs stay.
    `known`: each source's configured destinations."""
    async with translate_errors(), engine.begin() as conn:
        status, attempts, source = await lock_message(conn, message_id)
        if status == Status.PROCESSING:
            raise InvalidTransition(
                status,
                f"message {message_id} is processing; try again once that attempt has ended",
            )
        pair = (
            await conn.execute(PAIR_STATUS, {"id": message_id, "destination": destination})
        ).scalar()
        check_known(known, source, message_id, destination, pair)
        if pair in (None, Status.PROCESSED) and not force:
            done = "is processed" if pair is not None else "has not run for it"
            raise InvalidTransition(
                Status(pair or Status.PROCESSED),
                f"destination {destination} of message {message_id} {done}; running it "
                'replays it, so send {"force": true} to do that',
            )
        action = ADMIN_REPLAY if pair in (None, Status.PROCESSED) else ADMIN_RETRY
        await conn.execute(
            PAIR_PENDING, {"id": message_id, "destination": destination, "source": source}
        )
        row = (await conn.execute(RESET_TO_PENDING, {"id": message_id})).one()
        await conn.execute(
            RECORD_PAIR_ACTION,
            {
                "id": message_id,
                "attempt": attempts,
                "outcome": action,
                "actor": actor,
                "destination": destination,
            },
        )
        await conn.execute(NOTIFY, {"source": source})
    return dict(row._mapping), action


async def discard_destination(
    engine: AsyncEngine,
    message_id: int,
    destination: str,
    actor: str,
    known: Mapping[str, Collection[str]],
) -> tuple[dict[str, Any], bool]:
    """Set one destination of a message aside; the message's status is summarised again.
    Returns (the message's row, whether anything changed)."""
    async with translate_errors(), engine.begin() as conn:
        status, attempts, source = await lock_message(conn, message_id)
        ids = {"id": message_id, "destination": destination}
        pair = (await conn.execute(PAIR_STATUS, ids)).scalar()
        check_known(known, source, message_id, destination, pair)
        if pair == Status.DISCARDED:
            return dict((await conn.execute(GET_MESSAGE, {"id": message_id})).one()._mapping), False
        if pair not in (Status.PENDING, Status.RETRYING, Status.DEAD):
            shown = "has not run for it" if pair is None else f"is {pair}"
            raise InvalidTransition(
                Status(pair or status),
                f"destination {destination} of message {message_id} {shown}; only a "
                "pending, retrying or dead destination can be discarded",
            )
        await conn.execute(PAIR_DISCARDED, ids)
        statuses = [r.status for r in await conn.execute(PAIR_STATUSES, {"id": message_id})]
        summary = summary_status(statuses)
        if summary == Status.RETRYING:  # another destination still runs: its schedule stays
            row = (await conn.execute(GET_MESSAGE, {"id": message_id})).one()
        else:
            row = (await conn.execute(SET_SUMMARY, {"id": message_id, "status": summary})).one()
        await conn.execute(
            RECORD_PAIR_ACTION,
            {**ids, "attempt": attempts, "outcome": ADMIN_DISCARD, "actor": actor},
        )
    return dict(row._mapping), True


async def replay_to_destination(
    engine: AsyncEngine,
    filters: MessageFilter,
    destination: str,
    actor: str,
    *,
    dry_run: bool,
    batch_size: int = BULK_BATCH_SIZE,
) -> BulkRetryResult:
    """Run `destination` for every message matching `filters` (of the destination's source,
    in `filters.source`) that is not in flight: older messages a destination added later
    never received, or a destination's messages again. Each message's other destinations are
    left as they are. One short transaction per batch of ids; `dry_run` only counts."""
    statuses = [s.value for s in Status if s != Status.PROCESSING]
    clauses, params = replace(filters, statuses=tuple(filters.statuses or statuses)).where()
    result = BulkRetryResult()
    result.matched, batches = await move_matching_to_pending(
        engine,
        where_sql(clauses),
        {**params, "actor": actor, "destination": destination},
        picked="",
        then=f"""
            paired AS (
                INSERT INTO inbox_destinations AS d (message_id, destination, source, status)
                SELECT id, :destination, source, 'pending' FROM picked
                    ON CONFLICT (message_id, destination) DO UPDATE
                   SET status = 'pending', budget_start = d.attempts, updated_at = now(),
                       processed_at = NULL
            ),
            recorded AS (
                INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at,
                                            outcome, actor, destination)
                SELECT id, old_attempts, now(), now(), '{ADMIN_REPLAY}', :actor, :destination
                  FROM picked
            )""",  # noqa: S608 - fixed values
        answer="",
        dry_run=dry_run,
        batch_size=batch_size,
        search=filters.search,
    )
    result.retried = sum(int(batch.n) for batch in batches)
    result.by_action[ADMIN_REPLAY] = result.retried
    return result


DESTINATION_COUNTS = text(
    """
    SELECT source, destination, status, count(*) AS n
      FROM inbox_destinations
     GROUP BY source, destination, status
     ORDER BY source, destination, status
    """
)


async def destination_counts(engine: AsyncEngine) -> dict[tuple[str, str], dict[str, int]]:
    """Pairs by status, per (source, destination) that has any."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    async with translate_errors(), engine.connect() as conn:
        for r in await conn.execute(DESTINATION_COUNTS):
            counts.setdefault((r.source, r.destination), {})[r.status] = int(r.n)
    return counts
