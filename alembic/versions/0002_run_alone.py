"""A message whose last attempt never finished runs alone.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Set when an expired claim is reaped (its worker died or hung mid-attempt), cleared when an
    # attempt finishes: such a message is claimed on its own, in a transaction of its own, so a
    # poison message can take down only itself. Constant default: no table rewrite.
    op.execute("ALTER TABLE inbox_messages ADD COLUMN run_alone boolean NOT NULL DEFAULT false")


def downgrade() -> None:
    op.execute("ALTER TABLE inbox_messages DROP COLUMN run_alone")
