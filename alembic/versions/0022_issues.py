"""Issues: the failures of one cause, one row per fingerprint, counted in the transaction that
records the failed attempts; and each failed attempt's fingerprint, so that an issue's
messages can be found (those whose latest failed attempt has it).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-12
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column without a default: no rewrite of inbox_attempts, only its catalog row.
    op.execute("ALTER TABLE inbox_attempts ADD COLUMN fingerprint text")
    op.execute(
        """
        CREATE TABLE inbox_issues (
            fingerprint text NOT NULL,
            source text NOT NULL,
            destination text,
            handler text,
            error_type text NOT NULL,
            frame text,
            detail text,
            status text NOT NULL,
            acknowledged_by text,
            note text,
            first_seen timestamp with time zone NOT NULL,
            last_seen timestamp with time zone NOT NULL,
            failed_attempts bigint NOT NULL,
            sample_error text,
            sample_traceback text,
            reopened_at timestamp with time zone,
            CONSTRAINT inbox_issues_pkey PRIMARY KEY (fingerprint),
            CONSTRAINT inbox_issues_status_check
                CHECK (status IN ('open', 'acknowledged', 'resolved', 'ignored'))
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_issues")
    op.execute("ALTER TABLE inbox_attempts DROP COLUMN fingerprint")
