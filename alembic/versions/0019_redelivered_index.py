"""The messages redelivered lately, by when: what `tail` reads to show each duplicate.

A redelivery leaves no row of its own: ingest counts it on its message's row (`receive_count`,
`last_received_at`), a write it already made. This partial index finds those rows by
`last_received_at` without reading the table. A first delivery (`receive_count` 1) adds no
entry to it, so accepting a message costs what it did; a redelivery adds one entry, and its
row's update is no longer HOT (the indexed columns change), so it adds an entry to each of
the table's indexes too.
Building it reads the table once while it blocks inserts (as 0003, 0006 and 0015 do).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-09
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX inbox_messages_redelivered_idx ON inbox_messages (last_received_at) "
        "WHERE receive_count > 1"
    )


def downgrade() -> None:
    op.execute("DROP INDEX inbox_messages_redelivered_idx")
