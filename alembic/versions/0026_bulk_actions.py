"""The admin audit of bulk actions: each retry, replay, discard or replay to a destination of
the messages a search matches, with its query, who ran it and its walk's progress, so that an
interrupted one can be resumed where its last committed batch left it.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-20
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_bulk_actions (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            action text NOT NULL
                CONSTRAINT inbox_bulk_actions_action_check
                CHECK (action IN ('retry', 'replay', 'discard', 'replay_destination')),
            destination text,
            query jsonb NOT NULL,
            actor text NOT NULL,
            status text NOT NULL
                CONSTRAINT inbox_bulk_actions_status_check
                CHECK (status IN ('running', 'finished', 'interrupted')),
            matched bigint NOT NULL,
            done bigint NOT NULL DEFAULT 0,
            after_id bigint NOT NULL DEFAULT 0,
            last_id bigint,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_bulk_actions")
