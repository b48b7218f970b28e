"""Inbox and attempts tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_messages (
            id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source           text        NOT NULL,
            message_id       text        NOT NULL CHECK (length(message_id) BETWEEN 1 AND 512),
            event_type       text,
            status           text        NOT NULL DEFAULT 'pending' CHECK (status IN
                ('pending', 'processing', 'processed', 'retrying', 'dead', 'discarded')),
            attempts         integer     NOT NULL DEFAULT 0,
            receive_count    integer     NOT NULL DEFAULT 1,
            received_at      timestamptz NOT NULL DEFAULT now(),
            last_received_at timestamptz NOT NULL DEFAULT now(),
            next_attempt_at  timestamptz NOT NULL DEFAULT now(),
            locked_until     timestamptz,
            processed_at     timestamptz,
            last_error       text,
            headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
            body             bytea       NOT NULL,
            content_type     text,
            -- The dedup key: ingest's INSERT ... ON CONFLICT DO NOTHING relies on it.
            CONSTRAINT inbox_messages_source_message_id_key UNIQUE (source, message_id)
        )
        """
    )
    # The worker's "due messages" query: a small partial index over the unfinished rows only.
    op.execute(
        "CREATE INDEX inbox_messages_due_idx ON inbox_messages (next_attempt_at, id) "
        "WHERE status IN ('pending', 'retrying')"
    )
    # Expired leases of crashed forwarders.
    op.execute(
        "CREATE INDEX inbox_messages_lease_idx ON inbox_messages (locked_until) "
        "WHERE status = 'processing'"
    )
    # Admin listing: newest first, overall and by source / status; retention by age.
    op.execute(
        "CREATE INDEX inbox_messages_received_idx ON inbox_messages (received_at DESC, id DESC)"
    )
    op.execute(
        "CREATE INDEX inbox_messages_source_received_idx "
        "ON inbox_messages (source, received_at DESC, id DESC)"
    )
    op.execute(
        "CREATE INDEX inbox_messages_status_received_idx "
        "ON inbox_messages (status, received_at DESC, id DESC)"
    )
    op.execute("CREATE INDEX inbox_messages_event_type_idx ON inbox_messages (event_type)")
    op.execute(
        """
        CREATE TABLE inbox_attempts (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            message_id   bigint      NOT NULL REFERENCES inbox_messages (id) ON DELETE CASCADE,
            attempt      integer     NOT NULL,
            started_at   timestamptz NOT NULL,
            finished_at  timestamptz,
            outcome      text        NOT NULL,
            error_type   text,
            error        text,
            traceback    text,
            duration_ms  double precision,
            actor        text
        )
        """
    )
    op.execute("CREATE INDEX inbox_attempts_message_idx ON inbox_attempts (message_id, id)")
    op.execute("CREATE INDEX inbox_attempts_started_idx ON inbox_attempts (started_at)")


def downgrade() -> None:
    op.execute("DROP TABLE inbox_attempts")
    op.execute("DROP TABLE inbox_messages")
