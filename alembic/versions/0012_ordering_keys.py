"""Ordering keys: messages with the same key are processed one at a time, in the order they
were accepted.

`inbox_messages.ordering_key` holds the source's `ordering_key` of each message (ingest writes
it; none for a source without one). The partial index holds the unfinished messages that have
a key: a claim passes over a message while an earlier one of its key is there (pending,
retrying, processing or dead), and the admin names that one ("held behind message N").
Adding the column is instant; building the index reads the table once while it blocks
inserts, which on a large inbox makes ingest wait (as 0003 and 0006 do).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE inbox_messages ADD COLUMN ordering_key text")
    op.execute(
        "CREATE INDEX inbox_messages_ordering_idx ON inbox_messages (source, ordering_key, id) "
        "WHERE ordering_key IS NOT NULL AND status NOT IN ('processed', 'discarded')"
    )


def downgrade() -> None:
    op.execute("DROP INDEX inbox_messages_ordering_idx")
    op.execute("ALTER TABLE inbox_messages DROP COLUMN ordering_key")
