"""Each broker consumer's state, shared by every process: one row per (source, consumer
process), written by the consumer every 5 s and on each change, deleted on a clean stop.

`/readyz`, `GET /admin/consumers` and `/metrics` (`webhook_inbox_consumer_lag`) read it, so
that whichever HTTP process answers sees every consumer, wherever it runs; a row not updated
for 15 s is a consumer that died without its clean stop (SIGKILL, a lost host).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-10
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_consumers (
            source text NOT NULL,
            consumer text NOT NULL,
            connected boolean NOT NULL,
            state text NOT NULL,
            last_error text,
            lag bigint,
            counts jsonb NOT NULL,
            started_at timestamp with time zone DEFAULT now() NOT NULL,
            updated_at timestamp with time zone DEFAULT now() NOT NULL,
            CONSTRAINT inbox_consumers_pkey PRIMARY KEY (source, consumer)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_consumers")
