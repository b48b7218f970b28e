"""What a claimed message is run with, and how its attempt ended: the rows the worker (or
sync ingest) runs and the results the store records (`store.attempts`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from service.core.status import Status

# The outcome of an attempt that did not run (a gate, its ordering key or the endpoint's
# Retry-After held it): its attempt is given back (`AttemptResult.deferred`).
DEFERRED = "deferred"


@dataclass(frozen=True, slots=True)
class DestinationState:
    """Where a named destination stands with one message (`load_destinations`), beyond its
    status: its attempts, `made` in all and `budget_start` made before its current budget
    began (an operator ran it again), and the slot it holds in its rate limit's queue.

    It is retried and dead-lettered on its own budget, `made - budget_start` of
    `max_attempts`, not the message's: a destination held back by a gate spends none while
    another one fails. `slot_at`: deferred by its rate limit, the slot whose token was taken
    for it (`core.flow.slot_holds`); None otherwise."""

    made: int = 0
    budget_start: int = 0
    slot_at: datetime | None = None

    @property
    def next(self) -> int:
        """The number of its next attempt."""
        return self.made + 1


NOT_RUN = DestinationState()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The cause of a failed attempt, as its issue (`inbox_issues`) is keyed: `key` hashes the
    readable parts (`processing.fingerprints`), the same in every process and after a restart.

    `handler`: the `module:function` that raised; `frame`: the innermost frame of the
    application's own code (`module:function`, no line); `detail`: a forward's status class or
    connection error kind, and its endpoint."""

    key: str
    source: str
    destination: str | None
    handler: str | None
    error_type: str
    frame: str | None
    detail: str | None


# MessageRow and AttemptResult are made for every message run: slotted, not frozen, since a
# frozen dataclass sets each field through object.__setattr__ (service/sources/base.py).
@dataclass(slots=True)
class MessageRow:
    """A message as the worker (or sync ingest) runs it; `attempts` = attempts made before,
    `budget_start` = attempts made before its current attempt budget began (an admin retry)."""

    id: int
    source: str
    message_id: str
    event_type: str | None
    attempts: int
    headers: dict[str, str]
    body: bytes
    content_type: str | None
    # The delivery span's W3C trace context, for the attempt's span (None: none stored).
    trace_context: Mapping[str, str] | None = None
    budget_start: int = 0
    # Of a source with named destinations: each destination that has run for the message,
    # and its status (`load_destinations`); empty when none has.
    destinations: dict[str, str] | None = None
    # And the rest of where each stands: its own attempt budget, its queue slot.
    destination_states: dict[str, DestinationState] | None = None
    # Its source's ordering key's value (None: it has none), and its status when claimed
    # (what it returns to when its run is deferred, `processing.ordering`).
    ordering_key: str | None = None
    status: Status = Status.PENDING

    def destination_state(self, name: str) -> DestinationState:
        """Where destination `name` stands with the message (never run: `NOT_RUN`)."""
        return (self.destination_states or {}).get(name, NOT_RUN)


@dataclass(slots=True)
class DestinationResult:
    """How one named destination's part of an attempt ended."""

    name: str
    status: Status  # processed, retrying or dead
    outcome: str
    started_at: datetime
    finished_at: datetime
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    delay_seconds: float | None = None  # retrying: when this destination would run next
    # It did not run: its rate limit or circuit breaker held it (`processing.gates`). It
    # stays pending (or retrying), no attempt spent, due again after `delay_seconds`.
    deferred: bool = False
    # Deferred to a slot of its rate limit's queue, whose token it holds (`processing.gates`);
    # None clears the one it had (it ran, or waits for something else).
    slot_at: datetime | None = None
    # Deferred by the endpoint's own answer (a 429 or 503 with `Retry-After`,
    # `processing.forward`), not by a gate: the answer is its error, shown as last_error.
    retry_after: bool = False
    # A failure's cause (not of a deferral): its attempt row names it, and its issue counts it.
    fingerprint: Fingerprint | None = None

    @property
    def duration_ms(self) -> float:
        return round((self.finished_at - self.started_at).total_seconds() * 1000, 3)


@dataclass(slots=True)
class AttemptResult:
    """How one attempt ended, to be written to the message row and inbox_attempts."""

    id: int
    attempt: int
    status: Status  # processed, retrying or dead
    outcome: str  # inbox_attempts.outcome
    started_at: datetime
    finished_at: datetime
    delay_seconds: float | None = None
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    # The attempt never finished (its claim expired): the message's next attempt runs alone.
    unfinished: bool = False
    # Of a source with named destinations, each destination the attempt ran: recorded as an
    # attempt each (`record_destinations`), instead of one of the whole message.
    destinations: list[DestinationResult] | None = None
    # Every destination due was deferred: nothing ran, and the attempt counted when the
    # message was claimed is given back.
    deferred: bool = False
    # Deferred by the endpoint's `Retry-After`: unlike a gate's or its key's deferral, it
    # replaces the message's last_error, so that an operator sees why the message waits.
    retry_after: bool = False
    # A failure's cause (of a message without named destinations; theirs carry their own).
    fingerprint: Fingerprint | None = None

    @property
    def duration_ms(self) -> float:
        return round((self.finished_at - self.started_at).total_seconds() * 1000, 3)
