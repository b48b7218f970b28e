"""Flow control's rules, pure: how many messages of one (source, destination) may be claimed
now, from its rate limit's bucket, its circuit breaker and the clock, and how outcomes move
the breaker. No database and no clock of its own: `store.flow` reads the rows and the
database's clock under lock, asks these functions, and writes back what they return, so every
process, the admin API and the metrics derive the same state in one vocabulary.

A pause is the claim statement's (`store.due.not_paused`): it holds a source's messages in the
database itself, so no admission is needed to honour it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

# While closed, claims in flight hold all the failures left: look again this soon.
RESERVED_RECHECK_SECONDS = 0.2
# While another process's probe is out: look again at most this late.
PROBE_RECHECK_SECONDS = 1.0
# While runs wait in a rate limit's queue, look again at least this often: a bucket holds at
# most one second's worth, so a look a second (or a token, if sooner) lets no token go unused.
QUEUE_RECHECK_SECONDS = 1.0
# A queue gives slots this far ahead at most; runs past it look again after it (spread over a
# second horizon): a slot is a promise made at the rate of its day, and a raised limit or a
# discarded backlog must not leave runs waiting on old promises for longer than this.
QUEUE_HORIZON_SECONDS = 600.0
# A queued run claimed this much before its slot still holds it (the clocks of the worker and
# the database differ a little; a run comes due a little after its slot, as it is recorded).
SLOT_EARLY_SECONDS = 0.05
# ... and this much after it, at least: a worker stalled on a loaded machine claims its runs
# late by seconds, and a run that lost its slot goes to the queue's end (a 10/s destination
# once ran at 1.6/s at load 8 when slots held for the bucket's window only, 1 s).
SLOT_LATE_SECONDS = 5.0


class BreakerState(StrEnum):
    """`closed`: calls go out; `open`: none until the cool-down ends; `half_open`: the
    cool-down is over and one probe decides."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Change(StrEnum):
    """What a claim's outcomes did to a breaker."""

    OPENED = "opened"  # failures in a row reached the limit
    REOPENED = "reopened"  # a probe failed
    CLOSED = "closed"  # a probe (or any call) succeeded while it was not closed


@dataclass(frozen=True)
class Gates:
    """One (source, destination)'s gates as configured: a rate limit (`per_second` None: none)
    and a circuit breaker (`breaker_failures` None: none, as for Python handlers)."""

    per_second: float | None = None
    burst: float = 0.0
    breaker_failures: int | None = None
    cooldown_seconds: float = 30.0

    @property
    def any(self) -> bool:
        return self.per_second is not None or self.breaker_failures is not None


@dataclass(frozen=True)
class Bucket:
    """A rate limit's token bucket as stored: `tokens` when last `refilled_at`, and the last
    slot given to a deferred run (`queued_until`, 0020): runs deferred after it come due after
    it, one token apart, so a backlog comes due as fast as its tokens exist, not all at once.
    A slot's token is taken when the slot is given, so `tokens` is below 0 by the tokens
    promised to queued runs (it refills to 0 as their slots come)."""

    tokens: float
    refilled_at: datetime
    queued_until: datetime | None = None


@dataclass(frozen=True)
class Breaker:
    """A circuit breaker as stored (0014)."""

    failures: int = 0
    open_until: datetime | None = None
    opened_at: datetime | None = None
    probing_until: datetime | None = None
    reserved: int = 0
    reserved_until: datetime | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class Admission:
    """What may be claimed now: `allowed` messages (of those wanted); when fewer, look again
    after `wait_seconds`. `probe`: the one message is the half-open breaker's probe.
    `reserved`: of a closed breaker's failures left, those this claim holds."""

    allowed: int
    wait_seconds: float
    breaker: BreakerState | None = None
    probe: bool = False
    reserved: int = 0
    # The tokens this admission took (given back for what the claim did not use).
    tokens: int = 0
    # `admit(queue=True)`: the seconds until the first slot of the runs not admitted (each
    # next one a token later), how many got one (the others are past the queue's horizon),
    # and whether runs deferred earlier were queued ahead (the runs asking for the first time
    # then got no token: those are the queued runs').
    slot_seconds: float = 0.0
    queued: bool = False
    slots: int = 0
    # Of `allowed`, the runs whose slot has come: admitted with the token their slot took.
    slotted: int = 0


def tokens_now(gates: Gates, bucket: Bucket | None, now: datetime) -> float:
    """The bucket refilled for the time since it was last touched, up to its burst; a bucket
    never used is full."""
    assert gates.per_second is not None
    if bucket is None:
        return gates.burst
    idle = max(0.0, (now - bucket.refilled_at).total_seconds())
    return min(gates.burst, bucket.tokens + gates.per_second * idle)


def token_wait(gates: Gates, tokens: float) -> float:
    """Seconds until a bucket holding `tokens` has a whole one."""
    assert gates.per_second is not None
    return max(0.0, (1.0 - tokens) / gates.per_second)


def _slots(
    gates: Gates, now: datetime, next_token: datetime, last: datetime | None, count: int
) -> tuple[float, datetime | None, int]:
    """Slots for `count` runs in a queue whose last slot is `last`: the seconds until the
    first (the next token, or one token after `last`), the queue's new last slot, and how
    many fit before the horizon (the others look again after it, `parked`)."""
    assert gates.per_second is not None
    step = timedelta(seconds=1 / gates.per_second)
    first = next_token if last is None else max(next_token, last + step)
    room = (now + timedelta(seconds=QUEUE_HORIZON_SECONDS) - first).total_seconds()
    slots = 0 if room < 0 else min(count, int(room * gates.per_second) + 1)
    if slots:
        last = first + step * (slots - 1)
    return (first - now).total_seconds(), last, slots


def slot_holds(gates: Gates, slot: datetime | None, now: datetime) -> bool | None:
    """Whether a queued run's `slot` is its to run on now: True when it has come (a little
    early is as good), False while it is ahead, None when there is none to hold (no slot, or
    one missed by more than `SLOT_LATE_SECONDS`, or the bucket's window if longer: its token
    is lost, and the run asks again). Runs late together run at once, at most that window's
    slots: a stalled worker catches up, and a paused source's queue does not come all at once
    when it resumes."""
    assert gates.per_second is not None
    if slot is None:
        return None
    ahead = (slot - now).total_seconds()
    if ahead > SLOT_EARLY_SECONDS:
        return False
    late = max(SLOT_LATE_SECONDS, gates.burst / gates.per_second)
    return True if -ahead <= late else None


def parked(wait_seconds: float, message: int) -> float:
    """A deferred run's wait, or, past the queue's horizon (it got no slot), the horizon and
    a part of another by the message's id, so that a deep backlog looks again spread out."""
    if wait_seconds <= QUEUE_HORIZON_SECONDS:
        return wait_seconds
    return QUEUE_HORIZON_SECONDS + message % int(QUEUE_HORIZON_SECONDS)


def breaker_state(breaker: Breaker | None, now: datetime) -> BreakerState:
    if breaker is None or breaker.open_until is None:
        return BreakerState.CLOSED
    return BreakerState.OPEN if breaker.open_until > now else BreakerState.HALF_OPEN


def _live(until: datetime | None, now: datetime) -> bool:
    return until is not None and until > now


def admit(
    gates: Gates,
    bucket: Bucket | None,
    breaker: Breaker | None,
    now: datetime,
    wanted: int,
    lease_seconds: float,
    *,
    queue: bool = False,
    fresh: int = 0,
    slotted: int = 0,
) -> tuple[Admission, Bucket | None, Breaker | None]:
    """How many of `wanted` messages may be claimed now, and the bucket and breaker as they
    stand after this claim took its share (None: the gate is not configured).

    The breaker is asked first: open, nothing (until its cool-down ends); half-open, one probe
    at a time across processes (leased for `lease_seconds`); closed, up to the failures left
    before it opens, less what other claims in flight hold. Then the bucket: whole tokens, as
    many as the breaker allows. A claim that gets nothing takes nothing.

    `queue` (runs already claimed, which wait if not admitted: a named destination's): each
    run not admitted gets the next free slot of the bucket's queue, one token after the last
    one given, up to `QUEUE_HORIZON_SECONDS` ahead, and the slot's token is taken then (the
    bucket goes below 0): a backlog comes due as its tokens exist, each run once (issue 63:
    a 1/s destination's 10,000 runs were claimed and deferred 130 times a second). The
    `slotted` of `wanted` are runs whose slot has come (`slot_holds`): they run on the token
    their slot took, as the breaker allows, so a run claimed a little late, or after a
    sibling, keeps its turn instead of queueing again at the end. While slots are given out
    ahead, the `fresh` of `wanted` (asking for the first time) get no token: it is a queued
    run's, and they queue behind.
    """
    allowed, wait, probe = wanted, 0.0, False
    state: BreakerState | None = None
    held = 0
    if gates.breaker_failures is not None:
        breaker = breaker or Breaker()
        state = breaker_state(breaker, now)
        if state is BreakerState.OPEN:
            assert breaker.open_until is not None
            return Admission(0, (breaker.open_until - now).total_seconds(), state), bucket, breaker
        if state is BreakerState.HALF_OPEN:
            if _live(breaker.probing_until, now):
                assert breaker.probing_until is not None
                until_probe = (breaker.probing_until - now).total_seconds()
                return (
                    Admission(0, min(PROBE_RECHECK_SECONDS, until_probe), state),
                    bucket,
                    breaker,
                )
            allowed, probe = min(1, wanted), True
        else:
            held = breaker.reserved if _live(breaker.reserved_until, now) else 0
            left = gates.breaker_failures - breaker.failures - held
            if left <= 0:
                return Admission(0, RESERVED_RECHECK_SECONDS, state), bucket, breaker
            allowed = min(wanted, left)
    taken, slot, queued, given, ran = 0, 0.0, False, 0, 0
    if gates.per_second is not None:
        holding = min(slotted, wanted) if queue else 0
        ran = min(holding, allowed)
        tokens = tokens_now(gates, bucket, now)
        last = bucket.queued_until if bucket is not None and queue else None
        queued = last is not None and last > now
        eligible = allowed - ran - (fresh if queued else 0)
        taken = max(0, min(eligible, int(tokens)))
        # The runs left with no token and no slot get the next free slots, and their tokens
        # are taken now (those whose slot the breaker held back keep it).
        waiting = wanted - holding - taken
        if queue and waiting > 0:
            next_token = now + timedelta(seconds=token_wait(gates, tokens - taken))
            slot, last, given = _slots(gates, now, next_token, last, waiting)
        kept = bucket.queued_until if bucket is not None and not queue else last
        bucket = Bucket(tokens - taken - given, now, kept)
        if taken + ran == 0:
            admission = Admission(0, token_wait(gates, tokens), state, slot_seconds=slot)
            return replace(admission, queued=queued, slots=given), bucket, breaker
        if taken + ran < wanted:
            wait = token_wait(gates, tokens - taken)
        allowed = taken + ran
    if breaker is not None and gates.breaker_failures is not None:
        if probe:
            breaker = replace(breaker, probing_until=now + timedelta(seconds=lease_seconds))
        else:
            breaker = replace(
                breaker,
                reserved=held + allowed,
                reserved_until=now + timedelta(seconds=lease_seconds),
            )
    return (
        Admission(
            allowed, wait, state, probe, 0 if probe else allowed, taken, slot, queued, given, ran
        ),
        bucket,
        breaker,
    )


def give_back(gates: Gates, bucket: Bucket, count: int) -> Bucket:
    """The bucket with `count` tokens a claim took and did not use returned (up to its burst)."""
    return replace(bucket, tokens=min(gates.burst, bucket.tokens + max(0, count)))


def record(
    gates: Gates,
    breaker: Breaker,
    now: datetime,
    *,
    failed: int,
    succeeded: int,
    error: str | None,
    released: int,
    probe: bool,
) -> tuple[Breaker, Change | None]:
    """A claim's outcomes counted: a success closes the breaker; failures count on and open it
    at the limit; a failed probe opens it for another cool-down. A probe with no outcome (no
    message was due) is released, the breaker left as it was. `released`: the failures this
    claim had reserved."""
    assert gates.breaker_failures is not None
    was = breaker_state(breaker, now)
    breaker = replace(
        breaker,
        reserved=max(0, breaker.reserved - released),
        probing_until=None if probe else breaker.probing_until,
    )
    if succeeded:
        closed = replace(breaker, failures=0, open_until=None, opened_at=None)
        return closed, (None if was is BreakerState.CLOSED else Change.CLOSED)
    if not failed:
        return breaker, None
    failures = breaker.failures + failed
    error = error or breaker.last_error
    cooldown = now + timedelta(seconds=gates.cooldown_seconds)
    if was is not BreakerState.CLOSED:
        # A failure while not closed: a probe's (or a call that began before it opened).
        change = Change.REOPENED if probe else None
        return replace(breaker, failures=failures, open_until=cooldown, last_error=error), change
    if failures >= gates.breaker_failures:
        opened = replace(
            breaker, failures=failures, open_until=cooldown, opened_at=now, last_error=error
        )
        return opened, Change.OPENED
    return replace(breaker, failures=failures, last_error=error), None
