"""Pausing a source's processing: the paused sources, who paused each and why.

While a source has a row here, no worker claims its messages (the claims read this table
once per statement); ingest goes on accepting and deduplicating its deliveries, which wait as
`pending` with no attempt spent. Stored in the database, a pause holds across restarts and
for every process on it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_source_pauses (
            source text NOT NULL,
            paused_at timestamp with time zone DEFAULT now() NOT NULL,
            operator text NOT NULL,
            reason text NOT NULL,
            actor text,
            CONSTRAINT inbox_source_pauses_pkey PRIMARY KEY (source)
        )
        """
    )


def downgrade() -> None:
    # The older release claims every source: a paused one resumes.
    op.execute("DROP TABLE inbox_source_pauses")
