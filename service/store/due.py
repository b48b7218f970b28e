"""The claim statements: which messages are due, written once and composed into each claim.

A message is due when its status is pending or retrying, its next attempt has come, its source
is not paused, and it may run now: a message whose last attempt never finished runs alone (its
own statements), and a message with an ordering key runs only as its key's head or behind the
head in the same claim. Unkeyed messages are claimed from the due index (0015: it holds no
keyed row, so a backlog held behind one key costs an unkeyed claim nothing); keyed ones from
the heads of their keys (`keyed_runs`), never by walking past the messages a head holds back.
"""

from __future__ import annotations

from service.core.status import DUE, Status, sql_list

_DUE_STATUSES = sql_list(DUE)
_FINISHED = sql_list([Status.PROCESSED, Status.DISCARDED])

# A paused source's messages are not claimed (0011): `inbox_source_pauses` holds a row per
# paused source, a handful at most, read once per statement (an InitPlan), so a pause takes
# effect at the next claim of every worker on the database, whatever its cache.
NOT_PAUSED = "source <> ALL(ARRAY(SELECT p.source FROM inbox_source_pauses AS p))"


def due_now(alias: str) -> str:
    """The row `alias` is due: its status and its time (not its source, pause or order)."""
    return f"{alias}.status IN ({_DUE_STATUSES}) AND {alias}.next_attempt_at <= now()"


def not_paused(alias: str) -> str:
    return f"{alias}.{NOT_PAUSED}"


# A message with an ordering key waits while an earlier message of its key is unfinished
# (pending, retrying, processing or dead: 0012's partial index holds exactly those). Only the
# claim of messages that run alone checks it row by row (a handful of rows); the others claim
# key heads (`keyed_runs`).
def in_order(alias: str) -> str:
    return f"""({alias}.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM inbox_messages AS e
         WHERE e.source = {alias}.source AND e.ordering_key = {alias}.ordering_key
           AND e.id < {alias}.id AND e.ordering_key IS NOT NULL
           AND e.status NOT IN ({_FINISHED})))"""  # noqa: S608 - an alias of ours


# The columns a claimed message is run with, in `claims.message_row`'s order.
ROW_COLUMNS = (
    "{m}.id, {m}.source, {m}.message_id, {m}.event_type, {m}.attempts, {m}.headers, {m}.body, "
    "{m}.content_type, {m}.trace_context, {m}.budget_start, {m}.ordering_key"
)


def unkeyed_walk(alias: str, *, alone: bool, sources: str = "$1::text[]") -> str:
    """The WHERE of a walk of the due index (0015) or, `alone`, of the alone index (0006)."""
    order = in_order(alias) if alone else f"{alias}.ordering_key IS NULL"
    return f"""{due_now(alias)}
           AND {alias}.source = ANY({sources})
           AND {not_paused(alias)}
           AND {order}
           AND {alias}.run_alone = {"true" if alone else "false"}"""


# A row's claim by a batch of Python handlers is live (0008): the batch is between its
# optimistic run and its rerun. Its message, and so its key, is passed over.
def no_live_claim(alias: str) -> str:
    return f"""NOT EXISTS (SELECT 1 FROM inbox_claims AS lc
                    WHERE lc.message_id = {alias}.id AND lc.attempt > {alias}.attempts
                      AND lc.locked_until >= now())"""  # noqa: S608 - an alias of ours


# The keyed messages to claim ($1 the sources, `limit` how many), as CTEs ending in `kept` (id,
# status as claimed): the head of each key (the lowest unfinished id, read from 0012's index
# by a loose index scan, one probe per key, stopping once `limit` due heads are found), then
# behind each due head the next messages of its key while they are due, up to an even share
# of the limit, so that one hot key fills a batch and a thousand keys get one each. A run is locked
# SKIP LOCKED, and only its unbroken prefix from the head is kept: a message is never
# claimed while an earlier one of its key is another worker's (a head, rank 1, is its own
# prefix: the count that checks the others is not run for it). The plan has one shape (index
# probes in nested loops over CTEs), whatever the statistics say. The batch runs a run in id
# order and defers what follows a message that does not succeed (`processing.ordering`).
_HEAD_DUE = f"""({due_now("o")} AND NOT o.run_alone AND {no_live_claim("o")})"""
_FOLLOWER_DUE = f"({due_now('o')} AND NOT o.run_alone)"


def keyed_runs(limit: str) -> str:
    return f"""
    keys(source, ordering_key, id, due, found) AS (
        SELECT f.source, f.ordering_key, f.id, f.due, 0
          FROM unnest($1::text[]) AS s(source)
         CROSS JOIN LATERAL (
            SELECT o.source, o.ordering_key, o.id, {_HEAD_DUE} AS due
              FROM inbox_messages AS o
             WHERE o.source = s.source AND {not_paused("o")}
               AND o.ordering_key IS NOT NULL AND o.status NOT IN ({_FINISHED})
             ORDER BY o.ordering_key, o.id
             LIMIT 1) AS f
        UNION ALL
        SELECT n.source, n.ordering_key, n.id, n.due, k.found + k.due::int
          FROM keys AS k
         CROSS JOIN LATERAL (
            SELECT o.source, o.ordering_key, o.id, {_HEAD_DUE} AS due
              FROM inbox_messages AS o
             WHERE o.source = k.source AND o.ordering_key > k.ordering_key
               AND o.ordering_key IS NOT NULL AND o.status NOT IN ({_FINISHED})
             ORDER BY o.ordering_key, o.id
             LIMIT 1) AS n
         WHERE k.found + k.due::int < {limit}
    ), heads AS (
        SELECT source, ordering_key, id FROM keys WHERE due LIMIT {limit}
    ), span AS (
        SELECT greatest(1, {limit} / greatest(count(*), 1))::int AS n FROM heads
    ), runs AS (
        SELECT h.id AS head, r.id, r.rank
          FROM heads AS h
         CROSS JOIN LATERAL (
            SELECT o.id, row_number() OVER w AS rank,
                   count(*) FILTER (WHERE NOT {_FOLLOWER_DUE}) OVER w AS blocked
              FROM inbox_messages AS o
             WHERE o.source = h.source AND o.ordering_key = h.ordering_key
               AND o.ordering_key IS NOT NULL AND o.status NOT IN ({_FINISHED})
            WINDOW w AS (ORDER BY o.id)
             ORDER BY o.id
             LIMIT (SELECT n FROM span)) AS r
         WHERE r.blocked = 0
    ), locked AS (
        SELECT m.id, m.status, r.head, r.rank
          FROM inbox_messages AS m JOIN runs AS r ON r.id = m.id
         WHERE {due_now("m")}
           FOR UPDATE OF m SKIP LOCKED
    ), kept AS (
        SELECT l.id, l.status
          FROM locked AS l
         WHERE l.rank = 1 OR l.rank = (SELECT count(*) FROM locked AS p
                          WHERE p.head = l.head AND p.rank <= l.rank)
    )"""  # noqa: S608 - fixed expressions, no input


# Claiming counts the attempt and commits before any handler runs (as Oban and River do), so
# an attempt that never finishes (the process killed, the machine lost, a handler that kills
# its worker) is still counted and its message still reaches the dead letters. The claim is a
# lease: `processing` until `locked_until`, then the reaper finishes it as abandoned. SKIP
# LOCKED: rows another worker holds are not waited for, so concurrent workers (threads or
# processes) take disjoint batches. $1 sources, $2 their leases (seconds), $3 how many.
_LEASE = f"""
    UPDATE inbox_messages AS m
       SET status = '{Status.PROCESSING.value}',
           attempts = m.attempts + 1,
           locked_until = clock_timestamp() + l.lease * interval '1 second'
      FROM {{claimed}}, unnest($1::text[], $2::float8[]) AS l(source, lease)
     WHERE m.id = {{claimed}}.id
       AND m.source = l.source
    RETURNING m.id, m.source, m.message_id, m.event_type, m.attempts - 1 AS attempts,
              m.headers, m.body, m.content_type, m.trace_context, m.budget_start,
              m.ordering_key, {{claimed}}.status
"""  # noqa: S608 - a fixed expression, no input


def _lease_claim(*, alone: bool) -> str:
    walk = f"""
    WITH due AS (
        SELECT id, status
          FROM inbox_messages AS w
         WHERE {unkeyed_walk("w", alone=alone)}
         ORDER BY next_attempt_at, id
         LIMIT $3
           FOR UPDATE SKIP LOCKED
    )"""  # noqa: S608 - a fixed expression, no input
    return walk + _LEASE.format(claimed="due")


CLAIM_DUE = _lease_claim(alone=False)
# A message whose last attempt never finished (`run_alone`) is claimed only by this, one at a
# time (the literal lets the planner use the tiny alone index, 0006).
CLAIM_ALONE = _lease_claim(alone=True)
# The keyed messages of leased sources (forwards), heads and runs (`keyed_runs`).
CLAIM_KEYED = "WITH RECURSIVE" + keyed_runs("$3") + _LEASE.format(claimed="kept")

# The claim of a batch of Python handlers (0008): inside the batch's own transaction, lock the
# due rows without changing them; the lock keeps every other claim, the reaper and the admin's
# changes off them until the transaction ends. Their attempts are counted by `record_claims`,
# from another connection, before any handler runs. A row whose claim is live belongs to a
# batch between its optimistic run and its rerun, and is passed over; one whose claim expired
# (`abandoned`) had an attempt that never finished, which this batch records instead of
# running it. A claim of an older attempt (not above `attempts`) is stale and ignored.
_LOCKED_COLUMNS = ROW_COLUMNS.format(m="m") + ", m.status, c.attempt IS NOT NULL AS abandoned"
# A message's claim, probed by its id on the primary key: a lateral subquery, which LIMIT keeps
# from being flattened into a join, so the probe is parameterized by `m.id` whatever the
# statistics say. As a plain LEFT JOIN, estimating one due row, the planner could scan the
# whole of `inbox_claims` (or its primary key, with sequential scans off) once per candidate,
# the join condition a filter: a table that churns a row per message and holds its dead rows
# until autovacuum comes (issue 70: 40-570 ms per claim of 100 from a backlog of a million).
# With sequential scans off too (`claims.CLAIM_PLANS`) the probe is its only plan.
_CLAIM = """LEFT JOIN LATERAL (
        SELECT c.attempt, c.locked_until FROM inbox_claims AS c
         WHERE c.message_id = m.id AND c.attempt > m.attempts
         LIMIT 1) AS c ON true"""
LOCK_DUE = f"""
    SELECT {_LOCKED_COLUMNS}
      FROM inbox_messages AS m
      {_CLAIM}
     WHERE {unkeyed_walk("m", alone=False)}
       AND (c.locked_until IS NULL OR c.locked_until < now())
     ORDER BY m.next_attempt_at, m.id
     LIMIT $2
       FOR UPDATE OF m SKIP LOCKED
"""  # noqa: S608 - a fixed expression, no input
# The keyed messages of Python handlers' sources, locked (`keyed_runs` locked them).
LOCK_KEYED = f"""
    WITH RECURSIVE {keyed_runs("$2")}
    SELECT {_LOCKED_COLUMNS}
      FROM kept
      JOIN inbox_messages AS m ON m.id = kept.id
      {_CLAIM}
"""  # noqa: S608 - a fixed expression, no input

# The worker's cheap look, every poll: is a message that must run alone due? (The alone
# index answers it, 0006.)
ALONE_DUE_SQL = f"""
    SELECT EXISTS (
        SELECT 1
          FROM inbox_messages AS w
         WHERE {unkeyed_walk("w", alone=True, sources="CAST(:sources AS text[])")}
    )
"""  # noqa: S608 - a fixed expression, no input

# Of the sources given ($1), those holding unfinished messages with an ordering key (0012's
# index answers it): a source whose ordering key was removed from its configuration still
# has its keyed messages claimed from their heads, in order, until they are finished.
KEYED_SOURCES = f"""
    SELECT s.source
      FROM unnest($1::text[]) AS s(source)
     WHERE EXISTS (SELECT 1 FROM inbox_messages AS o
                    WHERE o.source = s.source AND o.ordering_key IS NOT NULL
                      AND o.status NOT IN ({_FINISHED}))
"""  # noqa: S608 - a fixed expression, no input
