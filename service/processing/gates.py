"""Admission of named destinations' runs: each destination's rate limit and, for a forward, its
circuit breaker, shared by every process on the database (the same tables as a source's own:
`inbox_rate_limits`, `inbox_breakers`, under the key `source/destination`).

A batch asks before each gated destination runs for a message (`admit`): the answer is to run
now, or to wait so many seconds. A run that waits is deferred (`fanout.run_destinations`): the
destination stays pending, no attempt spent, and the message comes due again when it may run;
the message's other destinations are not held. One `DestinationGates` serves a batch and its
reruns (an optimistic batch rolled back and run again isolated), so an admission is asked for
once per (message, destination); `settle` returns what was taken and not used, and counts the
forwards' outcomes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.schema import Status
from service.processing.pipeline import Destination, Pipeline
from service.sources.config import ForwardConfig
from service.store import breakers, rate_limits
from service.store.claims import MessageRow

# Failures that say the endpoint is down, not that it refused the message: they count
# towards opening its circuit.
CIRCUIT_FAILURES = frozenset({"ForwardConnectionError", "ForwardTimeout"})
RATE_LIMITED = "rate limited"
CIRCUIT_OPEN = "circuit open"
# While a probe of another claim is out, or other claims hold what a closed breaker allows.
RECHECK_SECONDS = 1.0


def breaks_circuit(status: Status, error_type: str | None, error: str | None) -> bool:
    """Whether a forward's outcome says its endpoint is down (it counts towards the breaker)."""
    if status == Status.PROCESSED:
        return False
    if error_type in CIRCUIT_FAILURES:
        return True
    return error_type == "ForwardFailed" and (error or "").startswith("HTTP 5")


def gate_key(source: str, destination: str) -> str:
    """A destination's row in the shared tables: source names never hold a `/`."""
    return f"{source}/{destination}"


@dataclass(frozen=True)
class Deferral:
    """A run that may not start now: how long it waits, and why."""

    wait_seconds: float
    reason: str


@dataclass(frozen=True)
class BreakerChange:
    """A destination's breaker after a batch's forwards: opened, reopened or closed."""

    source: str
    destination: str
    change: str
    error: str | None
    cooldown_seconds: float


@dataclass(frozen=True)
class Settled:
    """What a batch's admissions came to: the breakers that changed, the runs admitted and
    the seconds waited per rate-limited destination, and when the first deferred run is due
    (None: none was deferred)."""

    changes: list[BreakerChange]
    claimed: dict[tuple[str, str], int]
    waited: dict[tuple[str, str], float]
    next_due: float | None


@dataclass
class _Breaker:
    """One destination's breaker as this batch holds it: what it may still forward, and the
    outcomes not counted yet."""

    state: str = "unasked"  # then breakers.Admission.state
    allowed: int = 0
    reserved: int = 0
    wait_seconds: float = 0.0
    failed: int = 0
    succeeded: int = 0
    error: str | None = None


@dataclass
class _Bucket:
    granted: int = 0
    used: int = 0
    asked: bool = False
    wait_seconds: float = 0.0
    deferred: int = 0


@dataclass
class DestinationGates:
    """The admissions of one batch (and its reruns)."""

    engine: AsyncEngine
    pipelines: Mapping[str, Pipeline]
    # Runs still to be asked for, per (source, destination): what a bucket or breaker is
    # asked for at once, so that a batch costs a round trip per destination, not per run.
    expected: Counter[tuple[str, str]] = field(default_factory=Counter)
    answers: dict[tuple[int, str], Deferral | None] = field(default_factory=dict)
    breakers: dict[tuple[str, str], _Breaker] = field(default_factory=dict)
    buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)
    changes: list[BreakerChange] = field(default_factory=list)
    next_due: float | None = None

    def expect(self, row: MessageRow, destinations: Iterable[Destination]) -> None:
        """Count the gated runs of `row` the batch will ask for (its due destinations)."""
        for destination in destinations:
            if destination.gated and (row.id, destination.name) not in self.answers:
                self.expected[(row.source, destination.name)] += 1

    async def admit(self, row: MessageRow, destination: Destination) -> Deferral | None:
        """None: run `destination` for `row` now; else how long it waits, and why."""
        memo = (row.id, destination.name)
        if memo in self.answers:
            return self.answers[memo]
        key = (row.source, destination.name)
        answer = await self._breaker_admits(key, destination)
        if answer is None:
            answer = await self._bucket_admits(key, destination)
            if answer is not None and destination.forward is not None:
                self.breakers[key].allowed += 1  # not forwarded: its admission stays unused
        if self.expected[key] > 0:
            self.expected[key] -= 1
        if answer is not None:
            self.next_due = min(answer.wait_seconds, self.next_due or answer.wait_seconds)
        self.answers[memo] = answer
        return answer

    def forwarded(
        self,
        row: MessageRow,
        destination: Destination,
        status: Status,
        error_type: str | None,
        error: str | None,
    ) -> Deferral | None:
        """Count a forward's outcome towards its destination's breaker. A probe that failed is
        the breaker's, not its message's: the run is deferred instead (until the breaker's
        next probe, no attempt spent), so that an outage, however long, sends no message to
        the dead letters by its probes."""
        breaker = self.breakers.get((row.source, destination.name))
        if breaker is None:
            return None
        if breaks_circuit(status, error_type, error):
            breaker.failed += 1
            breaker.error = error or error_type
            if breaker.state == "probe" and destination.forward is not None:
                wait = destination.forward.breaker_cooldown_seconds
                self.next_due = min(wait, self.next_due or wait)
                return Deferral(wait, f"{CIRCUIT_OPEN}: the probe failed: {breaker.error}")
        elif status == Status.PROCESSED:
            breaker.succeeded += 1
        return None

    async def _breaker_admits(
        self, key: tuple[str, str], destination: Destination
    ) -> Deferral | None:
        forward = destination.forward
        if forward is None:
            return None
        breaker = self.breakers.setdefault(key, _Breaker())
        if breaker.allowed <= 0 and breaker.state != "open":
            # Used up what it was allowed (or not asked yet): count what it forwarded, which
            # may close or open it, then ask again for the runs still to come.
            await self._record_breaker(key, forward)
            admission = await breakers.admit(
                self.engine,
                gate_key(*key),
                forward.breaker_failures,
                forward.timeout_seconds * max(1, self.expected[key]) + 5.0,
                max(1, self.expected[key]),
            )
            breaker.state = admission.state
            breaker.allowed = admission.allowed
            breaker.reserved = admission.allowed if admission.state == "closed" else 0
            breaker.wait_seconds = admission.wait_seconds or RECHECK_SECONDS
        if breaker.allowed > 0:
            breaker.allowed -= 1
            return None
        return Deferral(breaker.wait_seconds, CIRCUIT_OPEN)

    async def _bucket_admits(
        self, key: tuple[str, str], destination: Destination
    ) -> Deferral | None:
        limit = destination.rate_limit
        if limit is None:
            return None
        bucket = self.buckets.setdefault(key, _Bucket())
        if not bucket.asked:
            taken = await rate_limits.take(
                self.engine,
                gate_key(*key),
                limit.per_second,
                limit.burst,
                max(1, self.expected[key]),
            )
            bucket.asked, bucket.granted = True, taken.granted
            # The first run over the limit waits for the next token: now due, or one after
            # those granted.
            bucket.wait_seconds = taken.wait_seconds if not taken.granted else 1 / limit.per_second
        if bucket.used < bucket.granted:
            bucket.used += 1
            return None
        # Over the limit: each waits its turn, as the bucket refills, so that the runs of a
        # backlog come due one token apart instead of all at once.
        bucket.deferred += 1
        wait = bucket.wait_seconds + (bucket.deferred - 1) / limit.per_second
        return Deferral(wait, RATE_LIMITED)

    async def settle(self) -> Settled:
        """After the batch: give back the tokens taken and not used, and count the forwards'
        outcomes."""
        for key, bucket in self.buckets.items():
            limit = self.pipelines[key[0]].destination(key[1]).rate_limit
            assert limit is not None
            await rate_limits.give_back(
                self.engine, gate_key(*key), limit.burst, bucket.granted - bucket.used
            )
        for key in self.breakers:
            forward = self.pipelines[key[0]].destination(key[1]).forward
            assert forward is not None
            await self._record_breaker(key, forward)
        return Settled(
            self.changes,
            {key: b.used for key, b in self.buckets.items() if b.used},
            {key: b.wait_seconds for key, b in self.buckets.items() if b.deferred},
            self.next_due,
        )

    async def _record_breaker(self, key: tuple[str, str], forward: ForwardConfig) -> None:
        """Count the forwards of `key` since it was last admitted (none for an unasked or open
        breaker), releasing what it reserved; a change is kept for `settle` to return."""
        breaker = self.breakers[key]
        if breaker.state in ("unasked", "open"):
            return
        probe = breaker.state == "probe"
        is_open, opened = await breakers.record(
            self.engine,
            gate_key(*key),
            failed=breaker.failed,
            succeeded=breaker.succeeded,
            limit=forward.breaker_failures,
            cooldown=forward.breaker_cooldown_seconds,
            error=breaker.error,
            released=breaker.reserved,
        )
        if opened or (probe and (breaker.failed or breaker.succeeded)):
            self.changes.append(
                BreakerChange(
                    key[0],
                    key[1],
                    "opened" if opened else "reopened" if is_open else "closed",
                    breaker.error,
                    forward.breaker_cooldown_seconds,
                )
            )
        breaker.state = "open" if is_open else "unasked"
        breaker.allowed = breaker.reserved = breaker.failed = breaker.succeeded = 0
        breaker.wait_seconds = forward.breaker_cooldown_seconds if is_open else 0.0
