"""Redeliveries counted later, when their message's row is locked by a batch that runs it.

A redelivery is counted on its message's row (`receive_count`, `last_received_at`) by the
group commit's `ON CONFLICT DO UPDATE`, which waits for the row's lock. A batch of Python
handlers holds its messages' rows locked while the handlers run (0008), for up to
`handler_timeout_seconds`, so a redelivery of a message being handled held up its whole
ingest batch, and every delivery queued behind it, until the handler ended. Now the group
commit waits for such a lock only briefly; past that, the batch is written without touching
the stored rows and each redelivery it held is kept here, to be added to its message's row
by the worker once the row is free. A DELETE or TRUNCATE of messages takes their receipts
along, as 0007 and 0008 do for attempts and claims.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_receipts (
            id bigint GENERATED ALWAYS AS IDENTITY,
            source text NOT NULL,
            message_id text NOT NULL,
            received integer NOT NULL,
            received_at timestamp with time zone DEFAULT now() NOT NULL,
            CONSTRAINT inbox_receipts_pkey PRIMARY KEY (id)
        )
        """
    )
    op.execute(
        "CREATE FUNCTION inbox_receipts_follow_deleted() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN DELETE FROM inbox_receipts AS r USING deleted "
        "WHERE r.source = deleted.source AND r.message_id = deleted.message_id; "
        "RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_deleted_receipts AFTER DELETE ON inbox_messages
        REFERENCING OLD TABLE AS deleted
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_receipts_follow_deleted()
        """
    )
    op.execute(
        "CREATE FUNCTION inbox_receipts_follow_truncated() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN DELETE FROM inbox_receipts; RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_truncated_receipts AFTER TRUNCATE ON inbox_messages
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_receipts_follow_truncated()
        """
    )


def downgrade() -> None:
    # A receipt still here is a redelivery not yet counted: count it on its row first.
    op.execute(
        """
        UPDATE inbox_messages AS m
           SET receive_count = m.receive_count + r.received,
               last_received_at = greatest(m.last_received_at, r.received_at)
          FROM (SELECT source, message_id, sum(received)::int AS received,
                       max(received_at) AS received_at
                  FROM inbox_receipts GROUP BY source, message_id) AS r
         WHERE m.source = r.source AND m.message_id = r.message_id
        """
    )
    op.execute("DROP TRIGGER inbox_messages_truncated_receipts ON inbox_messages")
    op.execute("DROP FUNCTION inbox_receipts_follow_truncated()")
    op.execute("DROP TRIGGER inbox_messages_deleted_receipts ON inbox_messages")
    op.execute("DROP FUNCTION inbox_receipts_follow_deleted()")
    op.execute("DROP TABLE inbox_receipts")
