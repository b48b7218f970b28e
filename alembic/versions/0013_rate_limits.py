"""Rate limits: each rate-limited source's token bucket, shared by every process.

A source's `rate_limit` bounds how many of its messages are claimed per second by all the
workers on the database together, so the bucket is a row here, not process memory: a claim
takes what it may (one token a message, refilled at the rate since `refilled_at`, up to one
second's worth) and gives back what it did not claim. Messages over the limit wait as
`pending`, spending no attempt.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_rate_limits (
            source text NOT NULL,
            tokens double precision NOT NULL,
            refilled_at timestamp with time zone DEFAULT now() NOT NULL,
            CONSTRAINT inbox_rate_limits_pkey PRIMARY KEY (source)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_rate_limits")
