"""Admin reads and state changes over the inbox: listing, detail, retry, discard, statistics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import Row, TextClause, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.schema import DUE, SETTLED, Status, sql_list
from service.store.claims import CLAIMED_IDS, SHOWN_ATTEMPTS, SHOWN_STATUS
from service.store.errors import is_lock_timeout, translate_errors
from service.store.notifications import NOTIFY
from service.store.search import Plan, Search, SearchTooBroad, bounded


@dataclass(frozen=True)
class Position:
    """A row's place in the newest-first order: `(received_at, id)`, both descending."""

    received_at: datetime
    id: int


STATUSES = tuple(Status)
# Statuses an admin retry moves back to `pending`; `processed` only when forced (a replay).
RETRYABLE = frozenset({Status.RETRYING, Status.DEAD, Status.DISCARDED})
# What a bulk retry picks when its filter names no status: the messages that failed. Discarded
# ones were set aside on purpose and processed ones would be replays; both must be named.
BULK_DEFAULT_STATUSES = (Status.RETRYING, Status.DEAD)
# What a bulk replay picks when its filter names no status: the failed ones and, as a replay
# is asked for, the processed ones.
BULK_REPLAY_DEFAULT_STATUSES = (Status.RETRYING, Status.DEAD, Status.PROCESSED)
# Statuses a discard moves to `discarded`: unfinished or dead (`discard_message`).
DISCARDABLE = frozenset({Status.PENDING, Status.PROCESSING, Status.RETRYING, Status.DEAD})
# Worker attempt outcomes that are not failures; every other worker outcome counts as one.
SUCCESS_OUTCOMES = ("processed", "skipped")

ADMIN_RETRY = "admin_retry"
ADMIN_REPLAY = "admin_replay"
ADMIN_DISCARD = "admin_discard"

BULK_BATCH_SIZE = 500
# The stored statuses of a message whose handlers' batch is in flight (see SHOWN_STATUS).
IN_FLIGHT_STORED = frozenset({Status.PENDING, Status.RETRYING})

# A message of an ordering key that later messages of its key wait for (the ordering index's
# predicate, 0012).
KEYED_UNSETTLED = f"ordering_key IS NOT NULL AND status NOT IN ({sql_list(SETTLED)})"
# The earliest unfinished message of the same key before a message, which it waits for (0012):
# none for a finished message, or one without a key. Correlated on `inbox_messages`, unaliased;
# one probe of the ordering index (source, ordering_key, id) a row, so a page of 500 stays cheap.
HELD_BEHIND = f"""
    CASE WHEN {KEYED_UNSETTLED} THEN
        (SELECT min(e.id) FROM inbox_messages AS e
          WHERE e.source = inbox_messages.source AND e.ordering_key = inbox_messages.ordering_key
            AND e.id < inbox_messages.id
            AND e.ordering_key IS NOT NULL AND e.status NOT IN ({sql_list(SETTLED)}))
    END
"""  # noqa: S608 - fixed statuses, no input

# `attempts` here: those of the current budget (since accepted or last retried by an admin);
# `attempt_count_total` every one, as the history numbers them (`budget_start`: those before).
# `next_attempt_at` only while the worker is still to try it: the column keeps its last value
# once a message is processed, dead or discarded, and the admin API, the command line and the
# console all read it from here.
SUMMARY_COLUMNS = f"""
    id, source, message_id, event_type, {SHOWN_STATUS} AS status,
    {SHOWN_ATTEMPTS} - budget_start AS attempts, {SHOWN_ATTEMPTS} AS attempt_count_total,
    receive_count, received_at, last_received_at,
    CASE WHEN ({SHOWN_STATUS}) IN ({sql_list(DUE)}) THEN next_attempt_at END AS next_attempt_at,
    processed_at, last_error, ordering_key, {HELD_BEHIND} AS held_behind
"""


class MessageNotFound(Exception):
    """No inbox row has that id."""


class InvalidTransition(Exception):
    """The message's status does not allow the requested change; `detail` says why."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


# The exception type of a message's latest failed attempt (admin actions record none), read
# through inbox_attempts_message_idx; correlated on `inbox_messages.id`, so it fits any query
# over inbox_messages that is not aliased.
LAST_ERROR_TYPE = """
    SELECT a.error_type FROM inbox_attempts a
     WHERE a.message_id = inbox_messages.id AND a.error_type IS NOT NULL
     ORDER BY a.id DESC LIMIT 1
"""
# The fingerprint of a message's latest failed attempt: the issue it belongs to (admin actions
# and processed attempts have none). Correlated on `inbox_messages.id`, as LAST_ERROR_TYPE.
LAST_FINGERPRINT = """
    SELECT a.fingerprint FROM inbox_attempts a
     WHERE a.message_id = inbox_messages.id AND a.fingerprint IS NOT NULL
     ORDER BY a.id DESC LIMIT 1
"""
# The messages with a failed attempt of that fingerprint, through its partial index (0023): a
# superset of the messages that the planner may start from when the issue is small
# among the dead and unfinished.
FAILED_WITH = """
    SELECT f.message_id FROM inbox_attempts f
     WHERE f.fingerprint = :fingerprint AND f.fingerprint IS NOT NULL
"""


def glob_like(pattern: str) -> str | None:
    """The glob `pattern` (`*` any run of characters, `?` one, as the sources file's
    `event_types`) as a LIKE pattern, or None when it has no wildcard. LIKE's own `%`, `_`
    and its escape character `\\` are escaped, so they match only themselves."""
    if "*" not in pattern and "?" not in pattern:
        return None
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def event_type_clause(pattern: str, column: str = "event_type") -> tuple[str, dict[str, str]]:
    """The condition that `column` matches the event-type glob `pattern`, and its parameter:
    equality when it has no wildcard (the event_type index serves it), else LIKE, where a
    message without an event type matches `*`, as it does in the sources file."""
    like = glob_like(pattern)
    if like is None:
        return f"{column} = :event_type", {"event_type": pattern}
    return f"coalesce({column}, '') LIKE :event_type", {"event_type": like}


@dataclass(frozen=True)
class MessageFilter:
    """The admin listings' filters; every one that is set must hold (they combine with AND)."""

    source: str | None = None
    statuses: Sequence[str] = ()
    event_type: str | None = None
    message_id: str | None = None
    received_after: datetime | None = None  # inclusive
    received_before: datetime | None = None  # exclusive
    error_type: str | None = None  # of the message's latest failed attempt
    ordering_key: str | None = None
    held: bool | None = None  # True: only those held behind another (HELD_BEHIND); False: none
    fingerprint: str | None = None  # of the message's latest failed attempt: its issue's
    search: Search | None = None  # what the message holds (service.store.search)

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """SQL conditions (fixed text, values bound) and their parameters."""
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if self.source is not None:
            clauses.append("source = :source")
            params["source"] = self.source
        if self.statuses:
            # The rows' own statuses, through the status index. A message claimed by a batch of
            # Python handlers is `processing` though its row still says `pending` or
            # `retrying`: when `processing` is asked, those rows are found by id through their
            # claims (a few hundred at most) rather than among every pending row, and for any
            # stored status such a message may have, the shown status decides.
            params["statuses"] = list(self.statuses)
            stored = "status = ANY(:statuses)"
            if Status.PROCESSING in self.statuses:
                stored = f"({stored} OR id = ANY(ARRAY({CLAIMED_IDS})))"
            clauses.append(stored)
            if Status.PROCESSED not in self.statuses:
                # Implied already; written out so that a generic plan, which cannot look into
                # :statuses, still matches the partial status index's predicate (0003).
                clauses.append(f"status <> '{Status.PROCESSED.value}'")
            if Status.PROCESSING in self.statuses or set(self.statuses) & IN_FLIGHT_STORED:
                clauses.append(f"({SHOWN_STATUS}) = ANY(:statuses)")
        if self.event_type is not None:
            clause, bound = event_type_clause(self.event_type)
            clauses.append(clause)
            params |= bound
        if self.message_id is not None:
            clauses.append("message_id = :message_id")
            params["message_id"] = self.message_id
        if self.received_after is not None:
            clauses.append("received_at >= :received_after")
            params["received_after"] = self.received_after
        if self.received_before is not None:
            clauses.append("received_at < :received_before")
            params["received_before"] = self.received_before
        if self.error_type is not None:
            clauses.append(f"({LAST_ERROR_TYPE}) = :error_type")
            params["error_type"] = self.error_type
        if self.fingerprint is not None:
            clauses += [f"id IN ({FAILED_WITH})", f"({LAST_FINGERPRINT}) = :fingerprint"]
            params["fingerprint"] = self.fingerprint
        if self.ordering_key is not None:
            clauses.append("ordering_key = :ordering_key")
            params["ordering_key"] = self.ordering_key
        if self.held:
            # The first condition is the ordering index's predicate, so it may serve the scan.
            clauses += [KEYED_UNSETTLED, f"({HELD_BEHIND}) IS NOT NULL"]
        elif self.held is not None:
            clauses.append(f"({HELD_BEHIND}) IS NULL")
        if self.search is not None:
            searched, bound = self.search.where()
            clauses += searched
            params |= bound
        return clauses, params


def where_sql(clauses: Sequence[str]) -> str:
    return " AND ".join(clauses) if clauses else "TRUE"


# What a row adds to its summary when it is read with its delivery (an export's lines).
DELIVERY_COLUMNS = "headers, body, content_type"


async def list_messages(
    engine: AsyncEngine,
    filters: MessageFilter,
    limit: int,
    after: Position | None,
    *,
    delivery: bool = False,
) -> tuple[list[dict[str, Any]], Position | None]:
    """One page, newest first, and the position to continue after (None on the last page);
    with `delivery`, each row's headers, body and content type too.

    Keyset paging on `(received_at, id)`: a page starts strictly after the previous page's
    last row, so rows arriving meanwhile (always newer) never shift or repeat later pages.
    """
    columns = f"{SUMMARY_COLUMNS}, {DELIVERY_COLUMNS}" if delivery else SUMMARY_COLUMNS
    clauses, params = filters.where()
    if after is not None:
        clauses.append("(received_at, id) < (:after_received_at, :after_id)")
        params.update(after_received_at=after.received_at, after_id=after.id)
    params["limit"] = limit + 1  # one more than asked tells whether another page exists
    where = where_sql(clauses)
    async with translate_errors():
        if filters.search is None:
            async with engine.connect() as conn:
                found = await conn.execute(newest_first(where, columns), params)
                rows = [dict(r) for r in found.mappings()]
        else:
            rows = await searched_page(engine, filters.search, where, params, columns)
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    return rows, Position(last["received_at"], last["id"])


def newest_first(where: str, columns: str, *, among: str = "TRUE") -> TextClause:
    """A page of `columns` of the messages `where` matches (among `among`), newest first."""
    return text(
        f"SELECT {columns} FROM inbox_messages WHERE {among} AND {where} "  # noqa: S608 - fixed clauses, bound values
        "ORDER BY received_at DESC, id DESC LIMIT :limit"
    )


# A search that matches fewer messages than this has them all read through its indexes and
# the newest page taken from them; one that matches more, or whose index entries alone take
# longer than FEW_MATCHES_MS to read (a value a third of the messages hold has millions), is
# listed by walking the messages newest first, which then soon meets a page of them
# (`searched_page`). A customer's messages among 10 M number a few hundred.
FEW_MATCHES = 2000
FEW_MATCHES_MS = 500


async def searched_page(
    engine: AsyncEngine, search: Search, where: str, params: dict[str, Any], columns: str
) -> list[dict[str, Any]]:
    """A page of a search (`where`, with `search` among its clauses), newest first, read the
    way that suits how many it matches, which the planner cannot tell (see BOUND_SEARCH): up to
    FEW_MATCHES ids through the search's index bitmaps; if that is all of them, the page is
    taken from those, else the messages are walked newest first until it is full."""
    matched = text(f"SELECT id FROM inbox_messages WHERE {where} LIMIT {FEW_MATCHES}")  # noqa: S608
    ids: list[int] | None = None
    with contextlib.suppress(SearchTooBroad):  # too many to read through its indexes: walk
        async with engine.connect() as conn, bounded(conn, search, timeout_ms=FEW_MATCHES_MS):
            ids = [int(r.id) for r in await conn.execute(matched, params)]
    # The page: by id when they are all known, a probe of the primary key each, as the planner
    # chooses on its own (with bitmaps imposed, it walked the whole newest-first index); else
    # by walking newest first.
    page: TextClause = newest_first(where, columns)
    plan: Plan = "walk"
    if ids is not None and len(ids) < FEW_MATCHES:
        page, plan = newest_first(where, columns, among="id = ANY(:ids)"), "free"
        params = {**params, "ids": ids}
    async with engine.connect() as conn, bounded(conn, search, plan=plan):
        return [dict(r) for r in (await conn.execute(page, params)).mappings()]


# An export's page: few enough rows that a page of bodies is about a megabyte at a few KB a
# body (250 MiB at worst, every body at the default 1 MiB ingest limit), many enough that a
# million matches take 4,000 statements.
EXPORT_PAGE_SIZE = 250


async def matching_pages(
    engine: AsyncEngine,
    filters: MessageFilter,
    *,
    limit: int | None = None,
    page_size: int = EXPORT_PAGE_SIZE,
) -> AsyncIterator[list[dict[str, Any]]]:
    """Every message matching `filters` (the newest `limit` of them), newest first, with its
    delivery, one `list_messages` page at a time: what an export streams. Each page is its
    own statement (bounded in time by a search) on a connection held only for it, so memory,
    a statement's time and a connection's hold stay those of one page however many match.
    The first page is yielded even when empty, so that reading it checks the search."""
    after: Position | None = None
    left = limit
    while True:
        size = page_size if left is None else min(page_size, left)
        rows, after = await list_messages(engine, filters, size, after, delivery=True)
        yield rows
        if left is not None:
            left -= len(rows)
        if after is None or left == 0:
            return


GET_MESSAGE = text(
    f"SELECT {SUMMARY_COLUMNS}, headers, body, content_type, trace_context "  # noqa: S608
    "FROM inbox_messages WHERE id = :id"
)
GET_ATTEMPTS = text(
    """
    SELECT attempt, started_at, finished_at, outcome, error_type, error, traceback,
           duration_ms, actor, destination
      FROM inbox_attempts WHERE message_id = :id ORDER BY id
    """
)
# Where a message stands with each named destination that has run for it (0010), with its
# attempts in all (`attempts`) and since an operator last ran it again (`attempts_since`: of
# its own budget, 0018), whether by a retry or replay of it or of the whole message.
GET_DESTINATIONS = text(
    """
    SELECT destination AS name, status, attempts, last_error, updated_at, processed_at,
           attempts - budget_start AS attempts_since
      FROM inbox_destinations WHERE message_id = :id ORDER BY destination
    """
)
# What a whole message's retry does to its named destinations: the unfinished ones run
# again; a replay (of a processed message) runs every one again.
RESET_PAIRS = text(
    """
    UPDATE inbox_destinations
       SET status = 'pending', budget_start = attempts, updated_at = now(), processed_at = NULL
     WHERE message_id = :id AND (status <> 'processed' OR :replay)
    """
)
# And its discard: the destinations not processed are set aside with it. Of the messages
# `:ids`: one, or a bulk discard's batch.
DISCARD_PAIRS = text(
    """
    UPDATE inbox_destinations SET status = 'discarded', updated_at = now()
     WHERE message_id = ANY(:ids) AND status IN ('pending', 'retrying', 'dead')
    """
)


async def get_message(engine: AsyncEngine, message_id: int) -> dict[str, Any]:
    """The whole row (headers, body) with its attempt history, oldest attempt first."""
    async with translate_errors(), engine.connect() as conn:
        row = (await conn.execute(GET_MESSAGE, {"id": message_id})).one_or_none()
        if row is None:
            raise MessageNotFound(message_id)
        attempts = [dict(a._mapping) for a in await conn.execute(GET_ATTEMPTS, {"id": message_id})]
        destinations = await conn.execute(GET_DESTINATIONS, {"id": message_id})
    message = dict(row._mapping)
    message["attempt_history"] = attempts
    message["destinations"] = [dict(d._mapping) for d in destinations]
    return message


# The status as shown (a message between a batch's runs is `processing`), once any batch
# holding the row has ended.
LOCK_MESSAGE = text(
    f"SELECT {SHOWN_STATUS} AS status, attempts, source FROM inbox_messages "  # noqa: S608
    "WHERE id = :id FOR UPDATE"
)

# A fresh attempt budget: the worker claims `pending` rows whose next_attempt_at has come. The
# budget starts at the attempts made so far, so the numbering goes on where it was (1 failed,
# 2 failed, 3 dead, admin_retry, 4 ...). last_error stays as the record of why the message had
# failed; the history keeps the rest.
RESET_TO_PENDING = text(
    f"""
    UPDATE inbox_messages
       SET status = 'pending', budget_start = attempts, next_attempt_at = now(),
           locked_until = NULL, processed_at = NULL
     WHERE id = :id
    RETURNING {SUMMARY_COLUMNS}
    """  # noqa: S608
)

# A discard takes effect at once, even over a claim still live whose holder holds no lock (a
# killed process's lease or batch claim, up to its lease): the row becomes `discarded` and the
# claim is dropped, so no worker claims it again and the reaper passes it over. The claimed
# attempt stays counted (SHOWN_ATTEMPTS). A late finish of that attempt changes nothing: it is
# fenced on the status and attempts it claimed (FINISH_ATTEMPTS, HOLD_CLAIMED, HOLD_LOCKED).
# Of the messages `:ids`, locked by the caller: one, or a bulk discard's batch.
SET_DISCARDED = text(
    f"""
    WITH dropped AS (DELETE FROM inbox_claims WHERE message_id = ANY(:ids))
    UPDATE inbox_messages SET status = 'discarded', locked_until = NULL,
                              attempts = {SHOWN_ATTEMPTS}
     WHERE id = ANY(:ids)
    RETURNING {SUMMARY_COLUMNS}
    """  # noqa: S608
)

# Admin actions in the attempt history, one per message of `:ids`: each one's `attempt` (in
# `:attempts`, in the same order) is how many attempts the message had used.
RECORD_ACTION = text(
    """
    INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome, actor)
    SELECT taken.id, taken.attempt, now(), now(), :outcome, :actor
      FROM unnest(CAST(:ids AS bigint[]), CAST(:attempts AS integer[])) AS taken(id, attempt)
    """
)


# How long an admin action waits for its message's row lock. Ingest's count of a redelivery
# holds it for milliseconds; a batch of handlers holds it until the batch commits, which may
# take as long as its handlers do, and the message is in flight meanwhile: the action is then
# refused as it is for a `processing` message, rather than hanging on the batch. The wait is
# bounded only for that lock (the commit's own, NOTIFY's, keep the server's setting).
LOCK_WAIT = text("SET LOCAL lock_timeout = '2s'")
LOCK_WAIT_ENDED = text("SET LOCAL lock_timeout TO DEFAULT")


async def lock_message(conn: AsyncConnection, message_id: int) -> tuple[str, int, str]:
    """Lock a message for an admin action: its status as shown, attempts and source."""
    await conn.execute(LOCK_WAIT)
    try:
        row = (await conn.execute(LOCK_MESSAGE, {"id": message_id})).one_or_none()
    except DBAPIError as exc:
        if not is_lock_timeout(exc):
            raise
        raise InvalidTransition(
            Status.PROCESSING,
            f"message {message_id} is processing: a batch of its handlers holds it; "
            "try again once that attempt has ended",
        ) from exc
    await conn.execute(LOCK_WAIT_ENDED)
    if row is None:
        raise MessageNotFound(message_id)
    return str(row.status), int(row.attempts), str(row.source)


async def retry_message(
    engine: AsyncEngine, message_id: int, actor: str, force: bool
) -> tuple[dict[str, Any], str]:
    """Move one message back to `pending`; return the new row and the action recorded."""
    async with translate_errors(), engine.begin() as conn:
        status, attempts, source = await lock_message(conn, message_id)
        if status == Status.PROCESSED and not force:
            raise InvalidTransition(
                status,
                f"message {message_id} is processed; retrying replays its handlers, "
                'so send {"force": true} to do that',
            )
        if status not in RETRYABLE and status != Status.PROCESSED:
            raise InvalidTransition(
                status,
                f"message {message_id} is {status}; only retrying, dead, discarded or "
                "(forced) processed messages can be retried",
            )
        action = ADMIN_REPLAY if status == Status.PROCESSED else ADMIN_RETRY
        row = (await conn.execute(RESET_TO_PENDING, {"id": message_id})).one()
        await conn.execute(RESET_PAIRS, {"id": message_id, "replay": action == ADMIN_REPLAY})
        await conn.execute(
            RECORD_ACTION,
            {"ids": [message_id], "attempts": [attempts], "outcome": action, "actor": actor},
        )
        await conn.execute(NOTIFY, {"source": source})
    return dict(row._mapping), action


async def discard_message(
    engine: AsyncEngine, message_id: int, actor: str
) -> tuple[dict[str, Any], bool]:
    """Set a message aside as `discarded`; the row (the dedup key) stays. Returns (row, changed).

    A `processing` message is discarded too when no live attempt holds its row (its claim's
    holder was killed, or a batch is between its runs): see SET_DISCARDED. One whose attempt
    holds the row is refused after LOCK_WAIT (`lock_message`)."""
    async with translate_errors(), engine.begin() as conn:
        status, _, _ = await lock_message(conn, message_id)
        if status == Status.DISCARDED:
            row = (await conn.execute(GET_MESSAGE, {"id": message_id})).one()
            return dict(row._mapping), False
        if status == Status.PROCESSED:
            raise InvalidTransition(
                status,
                f"message {message_id} is processed; only unfinished or dead messages "
                "can be discarded",
            )
        (row,) = await set_discarded(conn, [message_id], actor)
    return dict(row._mapping), True


async def set_discarded(conn: AsyncConnection, ids: list[int], actor: str) -> list[Row[Any]]:
    """Discard the messages `ids`, which the caller has locked and found discardable, with
    their destinations not processed, and record the action on each: one message's discard,
    or a batch of a bulk discard. Answers their rows."""
    rows = list(await conn.execute(SET_DISCARDED, {"ids": ids}))
    await conn.execute(DISCARD_PAIRS, {"ids": ids})
    await conn.execute(
        RECORD_ACTION,
        {
            "ids": [r.id for r in rows],
            "attempts": [r.attempt_count_total for r in rows],
            "outcome": ADMIN_DISCARD,
            "actor": actor,
        },
    )
    return rows


@dataclass
class BulkRetryResult:
    matched: int = 0
    retried: int = 0
    by_action: dict[str, int] = field(default_factory=dict)


def bulk_statuses(filters: MessageFilter, force: bool) -> list[str]:
    """The statuses a bulk retry touches: those asked for that a retry may leave."""
    allowed = RETRYABLE | ({Status.PROCESSED} if force else set())
    asked = filters.statuses or BULK_DEFAULT_STATUSES
    return [s for s in STATUSES if s in asked and s in allowed]


def discard_statuses(filters: MessageFilter) -> list[str]:
    """The statuses a bulk discard touches: those asked for (by default the failed ones, as a
    bulk retry's) that a discard may leave, as `discard_message`'s: unfinished or dead."""
    asked = filters.statuses or BULK_DEFAULT_STATUSES
    return [s for s in STATUSES if s in asked and s in DISCARDABLE]


async def count_matching(
    engine: AsyncEngine, where: str, params: dict[str, Any], search: Search | None = None
) -> tuple[int, int | None]:
    """How many messages `where` (fixed clauses, bound `params`) matches, and the highest id
    of them: what a bulk action's walk goes up to (`in_batches`). With the `search` among
    them, the count is bounded in time (`bounded`)."""
    count_sql = text(f"SELECT count(*), max(id) FROM inbox_messages WHERE {where}")  # noqa: S608
    async with engine.connect() as conn, bounded(conn, search):
        counted = (await conn.execute(count_sql, params)).one()
    return int(counted[0]), counted[1]


# A step of a batch's transaction, given the batch's answer (`in_batches`).
BatchStep = Callable[[AsyncConnection, Row[Any]], Awaitable[None]]


@dataclass(frozen=True)
class BatchWalk:
    """A bulk change of the messages `where` (fixed clauses, bound `params`) matches, walked
    in batches of ids (`in_batches`): `batch_sql` picks a batch (`picked_batch`) and answers
    `last`, `n` and `sources`; `then`, if set, makes the rest of the change in the batch's
    transaction."""

    where: str
    params: dict[str, Any]
    batch_sql: TextClause
    then: BatchStep | None = None
    search: Search | None = None  # among the clauses: each statement is bounded in time


def picked_batch(where: str, columns: str) -> str:
    """The SELECT of a batch: up to `:batch` ids above `:after` and up to `:last_id` that
    `where` matches, locked, with `id`, `source`, `old_attempts` and `columns`."""
    return f"""
        SELECT id, source, attempts AS old_attempts{columns}
          FROM inbox_messages
         WHERE {where} AND id > :after AND id <= :last_id
         ORDER BY id
         LIMIT :batch
         -- A row a worker holds is skipped rather than waited for; it is not failed.
           FOR UPDATE SKIP LOCKED
    """  # noqa: S608 - fixed clauses, bound values


async def in_batches(
    engine: AsyncEngine,
    walk: BatchWalk,
    last_id: int,
    batch_size: int,
    *,
    after: int = 0,
    on_batch: BatchStep | None = None,
) -> AsyncIterator[Row[Any]]:
    """Run `walk` one committed transaction per batch, from the ids above `after`, waking the
    workers of the sources each touched; yield each batch's answer. `on_batch` runs last in
    each batch's transaction (a bulk action's progress, `store.bulk`): what it writes commits
    with the batch or not at all. Walking ids upwards to the highest one matched when the walk
    began bounds the work: a replayed message that the worker finishes again meanwhile is not
    picked a second time."""
    while True:
        async with engine.begin() as conn, bounded(conn, walk.search):
            batch = (
                await conn.execute(
                    walk.batch_sql,
                    {**walk.params, "after": after, "last_id": last_id, "batch": batch_size},
                )
            ).one()
            if not batch.n:
                return
            if walk.then is not None:
                await walk.then(conn, batch)
            for source in batch.sources:
                await conn.execute(NOTIFY, {"source": source})
            if on_batch is not None:
                await on_batch(conn, batch)
        yield batch
        after = int(batch.last)
        if batch.n < batch_size:
            return


def pending_walk(
    where: str,
    params: dict[str, Any],
    *,
    picked: str,
    then: str,
    answer: str,
    search: Search | None,
) -> BatchWalk:
    """Move every message `where` matches back to pending with a fresh attempt budget: each
    batch's answer has `last`, `n`, `sources`, then `answer`'s columns.

    A batch's `picked` CTE has each message's `id`, `source`, `old_attempts` and the columns
    `picked` adds; `then` is the batch's further CTEs, comma-separated as after WITH: what the
    action does besides moving the message."""
    batch_sql = text(
        f"""
        WITH picked AS ({picked_batch(where, picked)}),
        moved AS (
            UPDATE inbox_messages m
               SET status = 'pending', budget_start = m.attempts, next_attempt_at = now(),
                   locked_until = NULL, processed_at = NULL
              FROM picked
             WHERE m.id = picked.id
        ),
        {then}
        SELECT max(id) AS last, count(*) AS n, array_agg(DISTINCT source) AS sources{answer}
          FROM picked
        """  # noqa: S608 - fixed clauses, bound values
    )
    return BatchWalk(where, params, batch_sql, search=search)


async def walk_matching(
    engine: AsyncEngine, walk: BatchWalk, *, dry_run: bool, batch_size: int
) -> tuple[int, list[Row[Any]]]:
    """Count what `walk` matches, then (unless `dry_run`) walk it to the highest id counted:
    how many matched, and each batch's answer."""
    async with translate_errors():
        matched, last_id = await count_matching(engine, walk.where, walk.params, walk.search)
        if dry_run or last_id is None:
            return matched, []
        batches = [b async for b in in_batches(engine, walk, last_id, batch_size)]
    return matched, batches


def retry_walk(filters: MessageFilter, actor: str, *, force: bool) -> BatchWalk | None:
    """A bulk retry (`force`: and replay) of the messages matching `filters`, or None when no
    status it may leave is asked for."""
    statuses = bulk_statuses(filters, force)
    if not statuses:
        return None
    # The filter's other conditions, with the statuses a retry may leave: a message claimed by
    # a batch in flight shows as `processing` (SHOWN_STATUS) and is left alone, as
    # `retry_message` refuses it.
    clauses, params = replace(filters, statuses=tuple(statuses)).where()
    return pending_walk(
        where_sql(clauses),
        {**params, "actor": actor},
        picked=", status AS old_status",
        then=f"""
            -- Named destinations: the unfinished ones run again, every one for a replay.
            paired AS (
                UPDATE inbox_destinations d
                   SET status = 'pending', budget_start = d.attempts, updated_at = now(),
                       processed_at = NULL
                  FROM picked
                 WHERE d.message_id = picked.id
                   AND (d.status <> 'processed' OR picked.old_status = 'processed')
            ),
            recorded AS (
                INSERT INTO inbox_attempts
                       (message_id, attempt, started_at, finished_at, outcome, actor)
                SELECT id, old_attempts, now(), now(),
                       CASE WHEN old_status = 'processed' THEN '{ADMIN_REPLAY}'
                            ELSE '{ADMIN_RETRY}' END,
                       :actor
                  FROM picked
            )""",  # noqa: S608 - fixed values
        answer=", count(*) FILTER (WHERE old_status = 'processed') AS replays",
        search=filters.search,
    )


async def bulk_retry(
    engine: AsyncEngine,
    filters: MessageFilter,
    actor: str,
    *,
    force: bool,
    dry_run: bool,
    batch_size: int = BULK_BATCH_SIZE,
) -> BulkRetryResult:
    """Retry every message matching `filters`, one short transaction per batch of ids."""
    result = BulkRetryResult()
    walk = retry_walk(filters, actor, force=force)
    if walk is None:
        return result
    result.matched, batches = await walk_matching(
        engine, walk, dry_run=dry_run, batch_size=batch_size
    )
    for batch in batches:
        result.retried += int(batch.n)
        result.by_action[ADMIN_REPLAY] = result.by_action.get(ADMIN_REPLAY, 0) + batch.replays
        result.by_action[ADMIN_RETRY] = (
            result.by_action.get(ADMIN_RETRY, 0) + int(batch.n) - batch.replays
        )
    return result


def discard_walk(filters: MessageFilter, actor: str) -> BatchWalk | None:
    """A bulk discard of the messages matching `filters`, as `discard_message` discards one:
    only unfinished or dead ones, their claims dropped, their destinations not processed set
    aside, each recorded; one a live attempt holds is skipped (SKIP LOCKED) rather than
    waited for. None when no status a discard may leave is asked for."""
    statuses = discard_statuses(filters)
    if not statuses:
        return None
    clauses, params = replace(filters, statuses=tuple(statuses)).where()
    where = where_sql(clauses)
    # No NOTIFY: a discarded message gives a worker nothing to do.
    batch_sql = text(
        f"""
        WITH picked AS ({picked_batch(where, "")})
        SELECT max(id) AS last, count(*) AS n, CAST('{{}}' AS text[]) AS sources,
               array_agg(id) AS ids
          FROM picked
        """  # noqa: S608 - fixed clauses, bound values
    )

    async def discard_batch(conn: AsyncConnection, batch: Row[Any]) -> None:
        await set_discarded(conn, list(batch.ids), actor)

    return BatchWalk(where, params, batch_sql, discard_batch, filters.search)


RECENT_ATTEMPTS = text(
    """
    SELECT count(*) FILTER (WHERE NOT is_admin) AS attempts,
           count(*) FILTER (WHERE NOT is_admin AND outcome <> ALL(:success)) AS failures,
           count(*) FILTER (WHERE is_admin) AS admin_actions
      -- Workers record an actor too (worker:host:pid); admin actions are told by outcome.
      FROM (SELECT outcome, starts_with(outcome, 'admin_') AS is_admin
              FROM inbox_attempts
             WHERE started_at >= now() - interval '1 hour') AS recent
    """
)


async def recent_attempts(engine: AsyncEngine) -> tuple[int, int, int]:
    """Worker attempts, worker failures and admin actions started in the last hour."""
    async with translate_errors(), engine.connect() as conn:
        row = (await conn.execute(RECENT_ATTEMPTS, {"success": list(SUCCESS_OUTCOMES)})).one()
    return int(row.attempts), int(row.failures), int(row.admin_actions)


# The catch-up's two rates, over the last RATE_WINDOW_SECONDS: messages a worker finished well
# (succeeded attempts, as the activity chart counts them) and messages first received. Both
# read a time index, over what a few seconds hold, not the hour RECENT_ATTEMPTS reads.
RATE_WINDOW_SECONDS = 10
RECENT_RATES = text(
    f"""
    SELECT (SELECT count(*) FROM inbox_attempts
             WHERE started_at >= now() - interval '{RATE_WINDOW_SECONDS} seconds'
               AND outcome = ANY(:success)) AS drained,
           (SELECT count(*) FROM inbox_messages
             WHERE received_at >= now() - interval '{RATE_WINDOW_SECONDS} seconds') AS received
    """  # noqa: S608 - a constant of ours
)


class CatchUpFields(TypedDict):
    """A catch-up as `/admin/stats` and `/metrics` publish it, under their field names."""

    backlog: int
    drain_rate_per_second: float
    arrival_rate_per_second: float
    catch_up_seconds: float | None


@dataclass(frozen=True)
class CatchUp:
    """How fast the backlog (pending, retrying, processing) is being worked off."""

    backlog: int
    drained_per_second: float
    received_per_second: float

    @property
    def seconds_left(self) -> float | None:
        """The backlog over the rate it shrinks at (drained less received): 0 with no backlog,
        None while it is not shrinking."""
        if self.backlog == 0:
            return 0.0
        shrinking = self.drained_per_second - self.received_per_second
        return self.backlog / shrinking if shrinking > 0 else None

    def published(self) -> CatchUpFields:
        return CatchUpFields(
            backlog=self.backlog,
            drain_rate_per_second=self.drained_per_second,
            arrival_rate_per_second=self.received_per_second,
            catch_up_seconds=self.seconds_left,
        )


async def catch_up(engine: AsyncEngine, backlog: int) -> CatchUp:
    """`backlog` with the drain and arrival rates of the last RATE_WINDOW_SECONDS."""
    async with translate_errors(), engine.connect() as conn:
        row = (await conn.execute(RECENT_RATES, {"success": list(SUCCESS_OUTCOMES)})).one()
    return CatchUp(backlog, row.drained / RATE_WINDOW_SECONDS, row.received / RATE_WINDOW_SECONDS)


# Per minute of the last `:minutes` (the current, partial minute last): messages first received
# (a duplicate only bumps its row's receive_count, so it is not counted), and worker attempts
# started that succeeded or failed. Both scans use a time index (received, started).
ACTIVITY_PER_MINUTE = text(
    """
    WITH bounds AS (
        SELECT date_trunc('minute', now()) - (:minutes - 1) * interval '1 minute' AS since
    ),
    minutes AS (
        SELECT generate_series(since, date_trunc('minute', now()), interval '1 minute') AS minute
          FROM bounds
    ),
    received AS (
        SELECT date_trunc('minute', received_at) AS minute, count(*) AS n
          FROM inbox_messages, bounds
         WHERE received_at >= bounds.since
         GROUP BY 1
    ),
    attempted AS (
        SELECT date_trunc('minute', started_at) AS minute,
               count(*) FILTER (WHERE outcome = ANY(:success)) AS processed,
               count(*) FILTER (WHERE outcome <> ALL(:success)
                                  AND NOT starts_with(outcome, 'admin_')) AS failed
          FROM inbox_attempts, bounds
         WHERE started_at >= bounds.since
         GROUP BY 1
    )
    SELECT minutes.minute, coalesce(received.n, 0) AS received,
           coalesce(attempted.processed, 0) AS processed, coalesce(attempted.failed, 0) AS failed
      FROM minutes
      LEFT JOIN received USING (minute)
      LEFT JOIN attempted USING (minute)
     ORDER BY minutes.minute
    """
)


@dataclass(frozen=True)
class MinuteActivity:
    minute: datetime  # the minute's start
    received: int
    processed: int
    failed: int


async def activity_per_minute(engine: AsyncEngine, minutes: int) -> list[MinuteActivity]:
    """Messages received and attempts succeeded or failed, per minute, oldest minute first."""
    async with translate_errors(), engine.connect() as conn:
        rows = await conn.execute(
            ACTIVITY_PER_MINUTE, {"minutes": minutes, "success": list(SUCCESS_OUTCOMES)}
        )
        return [
            MinuteActivity(r.minute, int(r.received), int(r.processed), int(r.failed)) for r in rows
        ]


@dataclass(frozen=True)
class DeadLetterGroup:
    error_type: str | None  # None: no failed attempt recorded (rows older than attempt history)
    count: int
    sources: list[str]
    oldest_received_at: datetime
    newest_received_at: datetime
    latest_error: str | None  # the newest message's last error


async def dead_letter_groups(engine: AsyncEngine, filters: MessageFilter) -> list[DeadLetterGroup]:
    """The `dead` messages matching `filters`, grouped by their last failed attempt's error type,
    largest group first."""
    filters = replace(filters, statuses=("dead",))
    clauses, params = filters.where()
    query = text(
        f"""
        WITH dead AS (
            SELECT id, source, received_at, last_error, ({LAST_ERROR_TYPE}) AS error_type
              FROM inbox_messages
             WHERE {where_sql(clauses)}
        )
        SELECT error_type, count(*) AS n, array_agg(DISTINCT source) AS sources,
               min(received_at) AS oldest, max(received_at) AS newest,
               (array_agg(last_error ORDER BY id DESC))[1] AS latest_error
          FROM dead
         GROUP BY error_type
         ORDER BY n DESC, error_type NULLS LAST
        """  # noqa: S608 - fixed clauses, bound values
    )
    async with translate_errors(), engine.connect() as conn, bounded(conn, filters.search):
        rows = await conn.execute(query, params)
        return [
            DeadLetterGroup(
                r.error_type,
                int(r.n),
                sorted(r.sources),
                r.oldest,
                r.newest,
                r.latest_error,
            )
            for r in rows
        ]
