"""Trace context stored with each message; dead-letter alert watermarks.

Revision ID: 0004
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The W3C trace context of the delivery's span ({"traceparent", "tracestate"}), so each
    # processing attempt's span continues the trace the delivery began. Nullable, no default:
    # adding it rewrites nothing.
    op.execute("ALTER TABLE inbox_messages ADD COLUMN trace_context jsonb")
    # Per alert target and source: the last dead-letter attempt notified and when, so that a
    # notice survives a crash (it is sent again) and a source gets one notice per interval.
    op.execute(
        """
        CREATE TABLE inbox_alert_watermarks (
            target text NOT NULL,
            source text NOT NULL,
            last_attempt_id bigint NOT NULL,
            notified_at timestamptz,
            PRIMARY KEY (target, source)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_alert_watermarks")
    op.execute("ALTER TABLE inbox_messages DROP COLUMN trace_context")
