"""A named destination's rate-limit queue: the last slot given to a run deferred for want of
a token, on its bucket's row.

A run over the limit is deferred, no attempt spent. Each waited until the next token, so a
backlog of 10,000 behind a 1/s destination was claimed and deferred again 130 times a second,
taking claims, row writes and WAL from every other source. Now each deferred run gets the
next free slot after `queued_until`, one token apart, and comes due once, when its token
exists (service/core/flow.py, `admit`). The slot is the run's: its token is taken when it is
given, and the run's destination row keeps it (`inbox_destinations.slot_at`), so that a run
claimed a little late still runs on it instead of queueing again at the end.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-09
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE inbox_rate_limits ADD COLUMN queued_until timestamp with time zone")
    op.execute("ALTER TABLE inbox_destinations ADD COLUMN slot_at timestamp with time zone")


def downgrade() -> None:
    op.execute("ALTER TABLE inbox_destinations DROP COLUMN slot_at")
    op.execute("ALTER TABLE inbox_rate_limits DROP COLUMN queued_until")
