"""The failed attempts by fingerprint: what an issue's page and its retry read to find the
issue's messages (those whose latest failed attempt has its fingerprint) without walking every
dead or unfinished message of its source.

Partial: only a failed attempt has a fingerprint, so a processed attempt adds no entry and
processing costs what it did; a failed one adds one entry.
Building it reads the table once while it blocks inserts (as 0003, 0006 and 0015 do).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-13
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX inbox_attempts_fingerprint_idx ON inbox_attempts (fingerprint) "
        "WHERE fingerprint IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX inbox_attempts_fingerprint_idx")
