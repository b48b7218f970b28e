"""Attempts go with their message by a statement trigger, not by a foreign key.

A foreign key checks every row inserted into `inbox_attempts`: a per-row trigger that runs a
query (`SELECT 1 FROM inbox_messages ... FOR KEY SHARE`) for the message that the same
statement has just updated. The worker writes one attempt per message, so that check was
about a tenth of PostgreSQL's CPU per processed message: claim, hold, finish and commit of
20,000 messages in batches of 100 on PostgreSQL 15 took 51.0-52.5 µs a message with it and
45.5-47.5 without (three runs each). Every statement that writes an attempt names a message
it has just updated or locked, so the check never failed.

What the key also did, deleting a message's attempts with it, is kept: a statement-level
trigger deletes the attempts of the rows a DELETE removed (one set-based statement for a
whole retention batch, where the key ran a delete per row), and a TRUNCATE of the messages
deletes all attempts (with the key it had to say CASCADE, or fail). That trigger deletes
rather than truncates: a TRUNCATE naming both tables (as the tests' does) is still using the
attempts table when the trigger runs, and PostgreSQL refuses to truncate it a second time.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE inbox_attempts DROP CONSTRAINT inbox_attempts_message_id_fkey")
    op.execute(
        "CREATE FUNCTION inbox_attempts_follow_deleted() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN DELETE FROM inbox_attempts AS a USING deleted WHERE a.message_id = deleted.id; "
        "RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_deleted AFTER DELETE ON inbox_messages
        REFERENCING OLD TABLE AS deleted
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_attempts_follow_deleted()
        """
    )
    op.execute(
        "CREATE FUNCTION inbox_attempts_follow_truncated() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN DELETE FROM inbox_attempts; RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_truncated AFTER TRUNCATE ON inbox_messages
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_attempts_follow_truncated()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER inbox_messages_truncated ON inbox_messages")
    op.execute("DROP FUNCTION inbox_attempts_follow_truncated()")
    op.execute("DROP TRIGGER inbox_messages_deleted ON inbox_messages")
    op.execute("DROP FUNCTION inbox_attempts_follow_deleted()")
    # The key refuses orphans; none can exist, but a row written by hand could.
    op.execute(
        "DELETE FROM inbox_attempts AS a "
        "WHERE NOT EXISTS (SELECT FROM inbox_messages AS m WHERE m.id = a.message_id)"
    )
    op.execute(
        "ALTER TABLE inbox_attempts ADD CONSTRAINT inbox_attempts_message_id_fkey "
        "FOREIGN KEY (message_id) REFERENCES inbox_messages (id) ON DELETE CASCADE"
    )
