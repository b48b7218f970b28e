"""The deliveries ingest refused with a 4xx, kept a short while so an operator can see why.

A row per refused delivery: its source, when, the status and reason answered, the body's size
and its headers with every credential redacted; never its body (an unverified sender's bytes)
nor its query string (where a `token` may be). Written in batches apart from ingest's
transactions (service/store/rejections.py) and bounded per source: the newest rows only
(INBOX_REJECTED_PER_SOURCE), none older than a day.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-08
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_rejected_deliveries (
            id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
            source text NOT NULL,
            received_at timestamp with time zone NOT NULL,
            status smallint NOT NULL,
            reason text NOT NULL,
            detail text NOT NULL,
            size bigint NOT NULL,
            headers jsonb NOT NULL,
            request_id text,
            CONSTRAINT inbox_rejected_deliveries_pkey PRIMARY KEY (id)
        )
        """
    )
    op.execute(
        "CREATE INDEX inbox_rejected_deliveries_source_idx "
        "ON inbox_rejected_deliveries (source, id DESC)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_rejected_deliveries")
