"""A partial index over the due messages that must run alone.

Each worker process asks every poll whether a message whose last attempt never finished is
due, and claims such messages one at a time. Both walked the due index and read every due
row to find the few flagged `run_alone`; with statistics that had not seen the backlog yet,
the planner scanned the source index instead, through every row of the source. On a
200,000-message backlog either took about 40 ms a poll, growing with the backlog. This index
holds only the flagged rows: the same look takes 0.03 ms.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX inbox_messages_alone_idx ON inbox_messages (next_attempt_at, id) "
        "WHERE run_alone AND status IN ('pending', 'retrying')"
    )


def downgrade() -> None:
    op.execute("DROP INDEX inbox_messages_alone_idx")
