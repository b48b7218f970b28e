"""The due index holds unkeyed messages only: keyed ones are claimed from their keys' heads.

A claim walked the due index past every message held behind its key's head (one probe each),
so one hot key drained at 70-147 msgs/s. Keyed messages are now claimed from 0012's index of
unfinished keyed messages, a key's head and the run behind it (service/store/due.py), and the
due index leaves them out, so that a backlog held behind a key costs no claim anything.
Building the index reads the table once while it blocks inserts, which on a large inbox makes
ingest wait (as 0003, 0006 and 0012 do).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DROP INDEX inbox_messages_due_idx")
    op.execute(
        "CREATE INDEX inbox_messages_due_idx ON inbox_messages (next_attempt_at, id) "
        "WHERE status IN ('pending', 'retrying') AND ordering_key IS NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX inbox_messages_due_idx")
    op.execute(
        "CREATE INDEX inbox_messages_due_idx ON inbox_messages (next_attempt_at, id) "
        "WHERE status IN ('pending', 'retrying')"
    )
