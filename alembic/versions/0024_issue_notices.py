"""Alerts per issue: per alert target and issue, the opening last announced (or being
announced), so that each webhook gets one notice when an issue opens or reopens.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-14
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_issue_notices (
            target text NOT NULL,
            fingerprint text NOT NULL,
            opened_at timestamptz NOT NULL,
            claimed_at timestamptz,
            sent_at timestamptz,
            PRIMARY KEY (target, fingerprint)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_issue_notices")
