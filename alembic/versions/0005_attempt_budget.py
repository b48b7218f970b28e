"""An admin retry gives a fresh attempt budget without renumbering the attempts.

Revision ID: 0005
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # `attempts` when the current budget began: the budget is `max_attempts` attempts counted
    # from here, while the attempts themselves keep counting (1 failed, 2 failed, 3 dead,
    # admin_retry, 4 ...). An admin retry used to set `attempts` back to 0, so the history
    # numbered from 1 again; rows reset that way keep their numbers. Constant default: no
    # table rewrite.
    op.execute("ALTER TABLE inbox_messages ADD COLUMN budget_start integer NOT NULL DEFAULT 0")


def downgrade() -> None:
    # Back to one counter for both: the budget's attempts, as before.
    op.execute("UPDATE inbox_messages SET attempts = attempts - budget_start")
    op.execute("ALTER TABLE inbox_messages DROP COLUMN budget_start")
