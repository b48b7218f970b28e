"""The one `Status` enum of a message, apart from the tables so that the command line's
`--status` choices need no SQLAlchemy."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Where a message is (SPEC §5)."""

    PENDING = "pending"
    PROCESSING = "processing"
    PROCESSED = "processed"
    RETRYING = "retrying"
    DEAD = "dead"
    DISCARDED = "discarded"


# Claimable by a worker: new, or failed and waiting for their next attempt.
DUE = (Status.PENDING, Status.RETRYING)
# Not finished yet: what the backlog is made of.
UNFINISHED = (Status.PENDING, Status.RETRYING, Status.PROCESSING)


def sql_list(statuses: tuple[Status, ...] | list[Status]) -> str:
    """`'pending', 'retrying'` for an SQL `IN (...)`: the statuses are ours, never input."""
    return ", ".join(f"'{status.value}'" for status in statuses)
