"""Redeliveries kept aside by ingest (`inbox_receipts`, 0009), added to their messages' rows.

The group commit counts a redelivery on its message's row, waiting for the row's lock at most
`LOCK_WAIT`. A batch of Python handlers holds its rows locked while the handlers run, so a
redelivery of a message being handled is written to `inbox_receipts` instead. The worker folds
those into `receive_count` and `last_received_at` at each poll, for the rows no batch holds:
a redelivery is counted once, at most a poll after its message's attempt ends.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.savepoints import short_transaction

# One statement: lock the rows that have receipts and that no batch holds (SKIP LOCKED: a
# batch running its handlers keeps its rows, and their receipts wait for the next poll),
# delete those receipts, and add them to the rows. A receipt written after this statement's
# snapshot is not seen by the DELETE and stays for the next fold: none is counted twice, none
# is lost. The messages are found through their unique (source, message_id) index.
FOLD_RECEIPTS = text(
    """
    WITH free AS (
        SELECT m.id, m.source, m.message_id
          FROM inbox_messages AS m
         WHERE (m.source, m.message_id) IN (SELECT source, message_id FROM inbox_receipts)
           FOR NO KEY UPDATE OF m SKIP LOCKED
    ), folded AS (
        DELETE FROM inbox_receipts AS r
         USING free
         WHERE r.source = free.source AND r.message_id = free.message_id
        RETURNING free.id, r.received, r.received_at
    ), counted AS (
        UPDATE inbox_messages AS m
           SET receive_count = m.receive_count + f.received,
               last_received_at = greatest(m.last_received_at, f.received_at)
          FROM (SELECT id, sum(received)::int AS received, max(received_at) AS received_at
                  FROM folded GROUP BY id) AS f
         WHERE m.id = f.id
        RETURNING f.received
    )
    SELECT coalesce(sum(received), 0) FROM counted
    """
)


async def fold_receipts(engine: AsyncEngine) -> int:
    """Add the redeliveries kept aside to their messages' rows; how many were added."""
    async with short_transaction(engine) as conn:
        return int((await conn.execute(FOLD_RECEIPTS)).scalar_one())
