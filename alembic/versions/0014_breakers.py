"""Circuit breakers on forwards: each forwarding source's breaker, shared by every process.

After `breaker_failures` failures in a row of a source's forward (connection errors,
timeouts, 5xx), no worker claims its messages until `open_until`; then one worker takes the
probe (`probing_until`, its lease) and its outcome closes the breaker or opens it again.
Messages wait as `pending` or `retrying` meanwhile, spending no attempt. While closed, the
claims in flight hold `reserved` of the failures left (until `reserved_until`, their lease),
so all processes together send at most that many calls to an endpoint that may be down.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE inbox_breakers (
            source text NOT NULL,
            failures integer DEFAULT 0 NOT NULL,
            open_until timestamp with time zone,
            probing_until timestamp with time zone,
            opened_at timestamp with time zone,
            last_error text,
            reserved integer DEFAULT 0 NOT NULL,
            reserved_until timestamp with time zone,
            CONSTRAINT inbox_breakers_pkey PRIMARY KEY (source)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_breakers")
