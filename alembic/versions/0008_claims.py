"""Claims of the batches whose Python handlers run in the transaction that locks their rows.

Before, a claim updated each message row to `processing` (counting the attempt) and committed,
and the batch's transaction locked the rows again before its handlers ran. That update writes a
new version of the wide row and an entry in each of its full indexes; `status` is in the
partial indexes' predicates, so it is never a HOT update, and the finish writes another. Now a
batch of Python handlers locks its due rows without changing them, and counts the attempts in
this narrow table from a second connection, committed before any handler runs. The worker's
statements for a batch of 100 cost PostgreSQL 0.70-0.72x the CPU a message (bench/claims).

The message rows' lease (`processing`, `locked_until`) stays for forwards, whose HTTP call
holds no transaction, and for the messages that must run alone. A DELETE or TRUNCATE of
messages takes their claims along, as 0007 does for attempts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_claims (
            message_id bigint NOT NULL,
            attempt integer NOT NULL,
            locked_until timestamp with time zone NOT NULL,
            actor text,
            CONSTRAINT inbox_claims_pkey PRIMARY KEY (message_id)
        )
        """
    )
    op.execute(
        "CREATE FUNCTION inbox_claims_follow_deleted() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN DELETE FROM inbox_claims AS c USING deleted WHERE c.message_id = deleted.id; "
        "RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_deleted_claims AFTER DELETE ON inbox_messages
        REFERENCING OLD TABLE AS deleted
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_claims_follow_deleted()
        """
    )
    op.execute(
        "CREATE FUNCTION inbox_claims_follow_truncated() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN DELETE FROM inbox_claims; RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_truncated_claims AFTER TRUNCATE ON inbox_messages
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_claims_follow_truncated()
        """
    )


def downgrade() -> None:
    # A claim still here is an attempt in flight or abandoned: count it on the row, as a lease
    # that has expired, so the reaper of the older release records it.
    op.execute(
        """
        UPDATE inbox_messages AS m
           SET status = 'processing', attempts = c.attempt, locked_until = c.locked_until
          FROM inbox_claims AS c
         WHERE m.id = c.message_id
           AND m.status IN ('pending', 'retrying')
           AND c.attempt > m.attempts
        """
    )
    op.execute("DROP TRIGGER inbox_messages_truncated_claims ON inbox_messages")
    op.execute("DROP FUNCTION inbox_claims_follow_truncated()")
    op.execute("DROP TRIGGER inbox_messages_deleted_claims ON inbox_messages")
    op.execute("DROP FUNCTION inbox_claims_follow_deleted()")
    op.execute("DROP TABLE inbox_claims")
