"""Upgrading to each destination's own attempt budget (0018): a destination an operator ran
again keeps the budget its history shows, so it is not handed a fresh one nor dead at once."""

from __future__ import annotations

import asyncpg

from service.core.db import asyncpg_dsn
from service.core.migrations import upgrade
from tests.pg import migrated_database

# A message whose crm failed twice, was retried by an operator (admin_retry naming it), and
# failed once more; its ledger was processed at the first attempt and never reset. A second
# message, never retried, whose crm failed once.
FILL = """
WITH m AS (
    INSERT INTO inbox_messages (source, message_id, status, attempts, body)
    VALUES ('hooks', 'retried', 'retrying', 3, '{}'), ('hooks', 'plain', 'retrying', 1, '{}')
    RETURNING id, message_id
), d AS (
    INSERT INTO inbox_destinations (message_id, destination, source, status, attempts,
                                    processed_at)
    SELECT id, dest, 'hooks', st, n, CASE WHEN st = 'processed' THEN now() END
      FROM m, (VALUES ('retried', 'crm', 'retrying', 3), ('retried', 'ledger', 'processed', 1),
                      ('plain', 'crm', 'retrying', 1)) AS v(mid, dest, st, n)
     WHERE m.message_id = v.mid
)
INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome, destination)
SELECT id, a, now() + a * interval '1 second', now() + a * interval '1 second', o, dest
  FROM m, (VALUES ('retried', 1, 'failed', 'crm'), ('retried', 1, 'processed', 'ledger'),
                  ('retried', 2, 'failed', 'crm'), ('retried', 2, 'admin_retry', 'crm'),
                  ('retried', 3, 'failed', 'crm'), ('plain', 1, 'failed', 'crm'))
       AS v(mid, a, o, dest)
 WHERE m.message_id = v.mid
"""
BUDGETS = """
SELECT m.message_id, d.destination, d.attempts, d.budget_start
  FROM inbox_destinations d JOIN inbox_messages m ON m.id = d.message_id
 ORDER BY 1, 2
"""


async def test_each_destination_keeps_the_budget_its_history_shows(pg_server: str) -> None:
    async with migrated_database(pg_server, "0017") as (url, engine):
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await conn.execute(FILL)
            await upgrade(engine, "0018")
            budgets = [tuple(r) for r in await conn.fetch(BUDGETS)]
        finally:
            await conn.close()
    assert budgets == [
        ("plain", "crm", 1, 0),
        ("retried", "crm", 3, 2),  # one attempt of its budget used since the retry
        ("retried", "ledger", 1, 0),
    ]
