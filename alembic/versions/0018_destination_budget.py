"""Each named destination's own attempt budget: `inbox_destinations.budget_start`.

A destination is retried and dead-lettered on its own attempts, not the message's: a
destination held back by its rate limit, its breaker or its endpoint's Retry-After spends
none of its budget while another destination of the message fails. `budget_start` is the
destination's attempts when an operator last ran it again (a retry or replay of it, or of its
whole message), so `attempts - budget_start` is what it has used of `max_attempts`; until now
that was read from the message's history (the admin API's `attempts_since`), and the existing
rows get it from there once.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-08
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: no table rewrite.
    op.execute("ALTER TABLE inbox_destinations ADD COLUMN budget_start integer NOT NULL DEFAULT 0")
    # Only a destination whose message an operator ran again has a budget that did not start
    # at 0: its attempts after the latest retry or replay that reset it.
    op.execute(
        """
        UPDATE inbox_destinations AS d
           SET budget_start = greatest(d.attempts - (
                   SELECT count(*) FROM inbox_attempts AS a
                    WHERE a.message_id = d.message_id AND a.destination = d.destination
                      AND NOT starts_with(a.outcome, 'admin_')
                      AND a.id > coalesce((
                          SELECT max(r.id) FROM inbox_attempts AS r
                           WHERE r.message_id = d.message_id
                             AND r.outcome IN ('admin_retry', 'admin_replay')
                             AND (r.destination = d.destination
                                  OR (r.destination IS NULL
                                      AND (r.outcome = 'admin_replay' OR d.status <> 'processed'
                                           OR d.processed_at > r.started_at)))), 0)), 0)
         WHERE d.message_id IN (SELECT message_id FROM inbox_attempts
                                 WHERE outcome IN ('admin_retry', 'admin_replay'))
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE inbox_destinations DROP COLUMN budget_start")
