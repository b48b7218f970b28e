"""The one `Status` enum of a message, apart from the tables so that the command line's
`--status` choices need no SQLAlchemy."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum


class Status(StrEnum):
    """Where a message is (docs/handlers.md#what-happens-to-a-message)."""

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
# Done with for good: the later messages of an ordering key no longer wait for these (a dead
# one they do wait for, until it is retried or discarded).
SETTLED = (Status.PROCESSED, Status.DISCARDED)
# No worker takes these up again unless an operator does: the bulk of an inbox, whose counts
# are kept a while rather than made at every call (service.store.counts).
ENDED = (Status.PROCESSED, Status.DEAD, Status.DISCARDED)


def sql_list(statuses: Sequence[StrEnum]) -> str:
    """`'pending', 'retrying'` for an SQL `IN (...)`: the statuses are ours, never input."""
    return ", ".join(f"'{status.value}'" for status in statuses)


def summary_status(statuses: Iterable[str]) -> Status:
    """A message's status from its named destinations' (docs/routing.md#a-messages-status):
    `retrying` while any is unfinished, else `dead` if any is dead, else `discarded` if any was
    set aside, else `processed` (each processed, or none matched)."""
    seen = set(statuses)
    if seen & {Status.PENDING.value, Status.RETRYING.value, Status.PROCESSING.value}:
        return Status.RETRYING
    for status in (Status.DEAD, Status.DISCARDED):
        if status.value in seen:
            return status
    return Status.PROCESSED


class IssueStatus(StrEnum):
    """Where an issue (failures of one cause, `inbox_issues`) stands with the operator. A
    `resolved` issue that fails again is `open` again; `acknowledged` and `ignored` stay."""

    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"
    IGNORED = "ignored"


class BulkAction(StrEnum):
    """What an operator's bulk action does to every message a search matches
    (`inbox_bulk_actions`, docs/operating.md#bulk-actions)."""

    RETRY = "retry"
    REPLAY = "replay"
    DISCARD = "discard"
    REPLAY_DESTINATION = "replay_destination"


class BulkActionStatus(StrEnum):
    """Where a bulk action's walk is: `running` while a runner's heartbeat is fresh (or its
    runner died and nobody has resumed it yet), `interrupted` when its runner stopped it
    (shutdown, Ctrl-C), `finished` once it walked to its bound."""

    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"


class TailKind(StrEnum):
    """What the live tail (`webhook-inbox tail`, GET /admin/tail) shows happening to a message:
    its first delivery accepted, a redelivery of it, or an attempt's outcome."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    PROCESSED = "processed"
    FAILED = "failed"
    DEAD = "dead"


# The attempt outcomes (`inbox_attempts.outcome`) the tail shows, as the kind it shows them as:
# a failure that will be retried (or was abandoned by a worker that died) is `failed`; admin
# actions and deferred runs are not outcomes of a run and are not shown.
TAIL_OUTCOMES: dict[str, TailKind] = {
    "processed": TailKind.PROCESSED,
    "skipped": TailKind.PROCESSED,
    "failed": TailKind.FAILED,
    "retry_later": TailKind.FAILED,
    "abandoned": TailKind.FAILED,
    "dead": TailKind.DEAD,
}
