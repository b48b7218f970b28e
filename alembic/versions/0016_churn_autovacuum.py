"""Autovacuum for the tables that churn a row per message or per claim, set per table.

`inbox_claims` gets a row inserted and deleted for every message a Python handler runs,
`inbox_receipts` one for each redelivery of a message being handled, and `inbox_rate_limits`
and `inbox_breakers` an update of the same few rows per claim. At the default thresholds (20 %
of the table plus 50 rows) a table of a few live rows is vacuumed whenever autovacuum next
wakes (once a minute), throttled by the cost delay: a drain of 15,000 msgs/s leaves up to
900,000 dead claims behind between two visits (issue 70). Vacuumed after 1,000 dead rows
whatever the table's size, unthrottled: each of these vacuums reads a few pages. (The claim
no longer depends on it, `service/store/due.py`; the admin's status counts read the claims.)

`inbox_messages` keeps the defaults: its dead rows cost a claim the due index's dead entries,
about 2,000 buffers (2 ms) after 500,000 messages processed without a vacuum, while each of
its vacuums reads all of its indexes.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHURNING = ("inbox_claims", "inbox_receipts", "inbox_rate_limits", "inbox_breakers")
OPTIONS = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
}


def upgrade() -> None:
    settings = ", ".join(f"{name} = {value}" for name, value in OPTIONS.items())
    for table in CHURNING:
        op.execute(f"ALTER TABLE {table} SET ({settings})")


def downgrade() -> None:
    for table in CHURNING:
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(OPTIONS)})")
