"""Named destinations: where each message stands with each destination of its source.

A source may name several destinations (`[sources.X.destinations.NAME]`), each with its own
filter, attempts, status and dead letters, so one broken destination never holds back or
replays the others. A message's row keeps the summary of its destinations (its status, its
next attempt); `inbox_destinations` keeps each pair, written in the transaction that commits
the destination's effects. `inbox_attempts.destination` names the destination an attempt ran.

Nothing moves: a source without named destinations keeps its one unnamed destination on the
message row as before, and a message stored before this revision has no destination rows, so
a source that names destinations later runs each of them for its unfinished messages and
leaves its processed ones alone. A DELETE or TRUNCATE of messages takes their destination
rows along, as 0007 to 0009 do for attempts, claims and receipts.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = "'pending', 'processing', 'processed', 'retrying', 'dead', 'discarded'"


def upgrade() -> None:
    op.execute("ALTER TABLE inbox_attempts ADD COLUMN destination text")
    op.execute(
        f"""
        CREATE TABLE inbox_destinations (
            message_id bigint NOT NULL,
            destination text NOT NULL,
            source text NOT NULL,
            status text NOT NULL,
            attempts integer DEFAULT 0 NOT NULL,
            last_error text,
            updated_at timestamp with time zone DEFAULT now() NOT NULL,
            processed_at timestamp with time zone,
            CONSTRAINT inbox_destinations_pkey PRIMARY KEY (message_id, destination),
            CONSTRAINT inbox_destinations_status_check CHECK (status IN ({STATUSES}))
        )
        """
    )
    op.execute(
        """
        CREATE INDEX inbox_destinations_status_idx
            ON inbox_destinations (source, destination, status)
         WHERE status <> 'processed'
        """
    )
    op.execute(
        "CREATE FUNCTION inbox_destinations_follow_deleted() RETURNS trigger LANGUAGE plpgsql "
        "AS $$BEGIN DELETE FROM inbox_destinations AS d USING deleted "
        "WHERE d.message_id = deleted.id; RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_deleted_destinations AFTER DELETE ON inbox_messages
        REFERENCING OLD TABLE AS deleted
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_destinations_follow_deleted()
        """
    )
    op.execute(
        "CREATE FUNCTION inbox_destinations_follow_truncated() RETURNS trigger "
        "LANGUAGE plpgsql AS $$BEGIN DELETE FROM inbox_destinations; RETURN NULL; END$$"
    )
    op.execute(
        """
        CREATE TRIGGER inbox_messages_truncated_destinations AFTER TRUNCATE ON inbox_messages
        FOR EACH STATEMENT EXECUTE FUNCTION inbox_destinations_follow_truncated()
        """
    )


def downgrade() -> None:
    # The older release knows one destination per message: the message rows' summaries stay.
    op.execute("DROP TRIGGER inbox_messages_truncated_destinations ON inbox_messages")
    op.execute("DROP FUNCTION inbox_destinations_follow_truncated()")
    op.execute("DROP TRIGGER inbox_messages_deleted_destinations ON inbox_messages")
    op.execute("DROP FUNCTION inbox_destinations_follow_deleted()")
    op.execute("DROP TABLE inbox_destinations")
    op.execute("ALTER TABLE inbox_attempts DROP COLUMN destination")
